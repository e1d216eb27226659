# Sourced by the scripts that need root: run the calling script again as root,
# through sudo when there is one (a machine without sudo needs root to run it).
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then exec sudo -E "$PWD/scripts/$(basename "$0")" "$@"; fi
  echo "$(basename "$0") needs root and sudo is not installed: run it as root" >&2
  exit 77
fi
