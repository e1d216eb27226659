#!/usr/bin/env bash
# Fetch NVIDIA's real libcuda.so.1 (Debian non-free `libcuda1`) into a private
# cache WITHOUT installing it: a private apt configuration adds the `non-free`
# component to the mirrors this machine already uses, `apt-get download` fetches
# the .deb, and `dpkg -x` unpacks it under the cache.  Nothing system-wide changes.
#
# Two drivers, each in its own directory of the cache: 535 (bookworm's libcuda1,
# CUDA 12.2; the default, in libcuda1/) and 550 (trixie's, CUDA 12.4: it adds
# cuFuncGetName and cuKernelGetName; in libcuda1-550/).  550 is fetched from the
# same mirrors with the suite `trixie` in place of this machine's own.
#
# Usage: scripts/fetch_vendor_libs.sh [--driver 535|550] [CACHE_DIR]
#        (CACHE_DIR default: $PASTA_VENDOR_CACHE or ~/.cache/pasta-trace/vendor)
# Prints the path of libcuda.so.1 on success; exits 3 if the package cannot be
# fetched (the reason on stderr), 2 on a usage error.
set -euo pipefail
usage() { echo "usage: $0 [--driver 535|550] [CACHE_DIR]" >&2; exit 2; }
driver=535
if [ "${1:-}" = "--driver" ]; then
  [ $# -ge 2 ] || usage
  driver=$2; shift 2
fi
[ $# -le 1 ] || usage
case "$driver" in
  535) dest=libcuda1; suite="" ;;           # the machine's own suites (bookworm)
  550) dest=libcuda1-550; suite=trixie ;;
  *) usage ;;
esac
cache="${1:-${PASTA_VENDOR_CACHE:-$HOME/.cache/pasta-trace/vendor}}"
mkdir -p "$cache"
# An unpacked tree counts only with its VERSION, written last (below).
if [ -f "$cache/$dest/VERSION" ]; then
  found=$(find "$cache/$dest" -name 'libcuda.so.1' | head -n1)
  if [ -n "$found" ]; then echo "$found"; exit 0; fi
fi

apt_dir=$(mktemp -d); trap 'rm -rf "$apt_dir"' EXIT
mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/etc/sources.list.d" "$apt_dir/etc/preferences.d"
# Re-use the system's own mirrors and suites (deb822 or one-line format) with non-free added.
python3 - "$apt_dir/etc/sources.list" "$suite" <<'PY'
import glob, re, sys
only = sys.argv[2]  # a suite to use instead of the machine's own ("" keeps them)
out = []
for path in glob.glob("/etc/apt/sources.list.d/*.sources"):
    for stanza in open(path).read().split("\n\n"):
        d = {}
        for line in stanza.splitlines():
            if ":" in line and not line.lstrip().startswith("#"):
                k, v = line.split(":", 1); d[k.strip()] = v.strip()
        if d.get("Types", "").split() and "deb" in d["Types"].split() and "debian" in d.get("URIs", ""):
            for uri in d["URIs"].split():
                for suite in [only] if only else d.get("Suites", "").split():
                    if "security" not in suite + uri:
                        out.append(f"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {uri} {suite} main non-free")
for path in ["/etc/apt/sources.list"]:
    try:
        for line in open(path):
            m = re.match(r"\s*deb\s+(\S+)\s+(\S+)", line)
            if m and "security" not in m.group(1) + m.group(2):
                out.append(f"deb {m.group(1)} {only or m.group(2)} main non-free")
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
what="libcuda1 ($driver${suite:+, Debian $suite})"
if ! apt-get "${opts[@]}" -qq update >"$apt_dir/update.log" 2>&1; then
  echo "cannot fetch $what: apt-get update with non-free failed: $(tail -n1 "$apt_dir/update.log")" >&2; exit 3
fi
(cd "$apt_dir/archives" && apt-get "${opts[@]}" -qq download libcuda1 >"$apt_dir/dl.log" 2>&1) || {
  echo "cannot fetch $what: $(tail -n1 "$apt_dir/dl.log")" >&2; exit 3; }
deb=$(ls "$apt_dir"/archives/libcuda1_*.deb | head -n1)
version=$(dpkg-deb -f "$deb" Version)
if [ "${version%%.*}" != "$driver" ]; then
  echo "cannot fetch $what: the mirror has libcuda1 $version" >&2; exit 3
fi
# Unpacked beside its place and renamed into it: a fetch that is interrupted,
# or runs next to another one, never leaves a half-unpacked tree in use.
tmp=$(mktemp -d "$cache/.$dest.XXXXXX")
dpkg -x "$deb" "$tmp"
echo "$version" > "$tmp/VERSION"
rm -rf "${cache:?}/$dest"
mv -T "$tmp" "$cache/$dest" || rm -rf "$tmp"
find "$cache/$dest" -name 'libcuda.so.1' | head -n1
