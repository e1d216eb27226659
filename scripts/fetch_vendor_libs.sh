#!/usr/bin/env bash
# Fetch NVIDIA's real libcuda.so.1 (Debian non-free `libcuda1`) into a private
# cache WITHOUT installing it: a private apt configuration adds the `non-free`
# component to the mirrors this machine already uses, `apt-get download` fetches
# the .deb, and `dpkg -x` unpacks it under the cache.  Nothing system-wide changes.
#
# Usage: scripts/fetch_vendor_libs.sh [CACHE_DIR]   (default: $PASTA_VENDOR_CACHE or ~/.cache/pasta-trace/vendor)
# Prints the path of libcuda.so.1 on success; exits 3 if the package cannot be fetched.
set -euo pipefail
cache="${1:-${PASTA_VENDOR_CACHE:-$HOME/.cache/pasta-trace/vendor}}"
mkdir -p "$cache"
found=$(find "$cache/libcuda1" -name 'libcuda.so.1' 2>/dev/null | head -n1 || true)
if [ -n "$found" ]; then echo "$found"; exit 0; fi

apt_dir=$(mktemp -d); trap 'rm -rf "$apt_dir"' EXIT
mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/etc/sources.list.d" "$apt_dir/etc/preferences.d"
# Re-use the system's own mirrors and suites (deb822 or one-line format) with non-free added.
python3 - "$apt_dir/etc/sources.list" <<'PY'
import glob, re, sys
out = []
for path in glob.glob("/etc/apt/sources.list.d/*.sources"):
    for stanza in open(path).read().split("\n\n"):
        d = {}
        for line in stanza.splitlines():
            if ":" in line and not line.lstrip().startswith("#"):
                k, v = line.split(":", 1); d[k.strip()] = v.strip()
        if d.get("Types", "").split() and "deb" in d["Types"].split() and "debian" in d.get("URIs", ""):
            for uri in d["URIs"].split():
                for suite in d.get("Suites", "").split():
                    if "security" not in suite:
                        out.append(f"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {uri} {suite} main non-free")
for path in ["/etc/apt/sources.list"]:
    try:
        for line in open(path):
            m = re.match(r"\s*deb\s+(\S+)\s+(\S+)", line)
            if m and "security" not in m.group(2):
                out.append(f"deb {m.group(1)} {m.group(2)} main non-free")
    except FileNotFoundError:
        pass
if not out:
    sys.exit("no Debian mirror found in /etc/apt")
open(sys.argv[1], "w").write("\n".join(dict.fromkeys(out)) + "\n")
PY
opts=(-o Dir::Etc::SourceList="$apt_dir/etc/sources.list" -o Dir::Etc::SourceParts="$apt_dir/etc/sources.list.d"
      -o Dir::Etc::Preferences="$apt_dir/etc/preferences" -o Dir::Etc::PreferencesParts="$apt_dir/etc/preferences.d"
      -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache::Archives="$apt_dir/archives" -o Debug::NoLocking=1
      -o APT::Architecture=amd64)
if ! apt-get "${opts[@]}" -qq update >"$apt_dir/update.log" 2>&1; then
  echo "cannot fetch libcuda1: apt-get update with non-free failed: $(tail -n1 "$apt_dir/update.log")" >&2; exit 3
fi
(cd "$apt_dir/archives" && apt-get "${opts[@]}" -qq download libcuda1 >"$apt_dir/dl.log" 2>&1) || {
  echo "cannot fetch libcuda1: $(tail -n1 "$apt_dir/dl.log")" >&2; exit 3; }
deb=$(ls "$apt_dir"/archives/libcuda1_*.deb | head -n1)
rm -rf "$cache/libcuda1"; mkdir -p "$cache/libcuda1"
dpkg -x "$deb" "$cache/libcuda1"
dpkg-deb -f "$deb" Version > "$cache/libcuda1/VERSION"
find "$cache/libcuda1" -name 'libcuda.so.1' | head -n1
