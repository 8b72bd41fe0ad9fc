# Shared by scripts/test, scripts/bench-load, scripts/setup-llama and scripts/nginx-binary
# (sourced, not run).

# apt-get as root (through sudo when not root), non-interactive, waiting for another
# apt/dpkg (e.g. unattended upgrades) instead of failing on its lock. Output to stderr,
# so scripts that print a result on stdout stay clean.
apt_get() {
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 "$@" >&2
}

# apt_install_missing WHO PACKAGE... — installs the packages (without recommends), after
# one `apt-get update`; nothing when the list is empty.
apt_install_missing() {
  local who=$1
  shift
  if (($#)); then
    echo "$who: installing $*" >&2
    apt_get update -qq
    apt_get install -y -qq --no-install-recommends "$@"
  fi
}
