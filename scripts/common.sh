# What the installer scripts (setup.sh, build_image.sh) share; sourced after `STEP=NAME`, the
# name their lines carry ("[setup] ...").
say() { printf '[%s] %s\n' "$STEP" "$*"; }
die() { printf '[%s] error: %s\n' "$STEP" "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else die "need root (or sudo) to run: $*"; fi
}
