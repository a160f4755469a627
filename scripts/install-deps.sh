#!/usr/bin/env bash
# Installs what llmhpc needs on Debian/Ubuntu, and only what is missing. As root it runs
# apt-get (and pip for the Python packages if the python3 on PATH is not the system one);
# otherwise it prints the commands to run.
#   scripts/install-deps.sh          (make deps runs it)
# PYTHON (default python3): the Python the analysis scripts run under, given the Python packages.
set -euo pipefail
# Arguments are refused, not ignored: as root, a misspelt --help would go on to apt-get install.
if [ $# -gt 0 ]; then
  case $1 in
    -h | --help) sed -n '2,/^[^#]/{/^#/!d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "$0: it takes no arguments, not '$*' (--help says what it does)" >&2; exit 2 ;;
  esac
fi
PYTHON=${PYTHON:-python3}

PACKAGES=(build-essential cmake pkg-config git
          libopenmpi-dev openmpi-bin libhdf5-dev libboost-program-options-dev libopenblas-dev libgtest-dev
          python3-h5py python3-numpy python3-pandas python3-matplotlib
          iproute2)  # ip netns: the fake nodes of tests/scripts/test_fake_nodes.sh

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "install-deps: missing packages; run:"
    echo "  sudo apt-get install -y ${missing[*]}"
    exit 1
  fi
fi

# The analysis scripts run under whatever python3 is on PATH (pyenv, conda, a venv):
# give it the packages if the Debian ones are not visible to it.
if ! "$PYTHON" -c "import h5py, numpy, pandas, matplotlib" 2>/dev/null; then
  echo "install-deps: installing h5py numpy pandas matplotlib for $("$PYTHON" -c 'import sys; print(sys.executable)')"
  "$PYTHON" -m pip install -q h5py numpy pandas matplotlib
fi
