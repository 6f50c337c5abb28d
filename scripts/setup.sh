#!/usr/bin/env bash
# Create or refresh .venv in the checkout, install model-boss with the given extras,
# and fetch the demo model. Usage: scripts/setup.sh [EXTRAS]   (default: llama)
# Packages are installed with uv (parallel downloads, several times faster than pip from an
# empty cache; uv itself comes from PyPI into the venv); pip is the fallback.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-llama}"
python=${PYTHON:-python3}
# The venv comes without pip (ensurepip took 5 of this script's 26 s from empty caches):
# torch and uv are installed through the system's pip (--python), pip itself by uv with
# the rest. A system pip too old for --python (before 22.3) or missing: ensurepip after all.
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv --without-pip .venv
fi
if .venv/bin/python -c "import pip" 2>/dev/null; then
  pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
elif "$python" -c "import importlib.metadata as m, sys; sys.exit(tuple(map(int, m.version('pip').split('.')[:2])) < (22, 3))" 2>/dev/null; then
  pip=("$python" -m pip --python .venv/bin/python install --quiet --disable-pip-version-check)
else
  .venv/bin/python -m ensurepip --upgrade --default-pip >/dev/null
  pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
fi
# What was installed last (pyproject.toml's hash, the extras): the same file and no new extra
# need no install (scripts/test.sh runs this again after .ci/run did: 2.4 s of resolving)
stamp=.venv/.model-boss-installed
digest=$(sha256sum pyproject.toml | cut -d" " -f1)
installed=""
if [ -f "$stamp" ] && [ "$(sed -n 1p "$stamp")" = "$digest" ]; then
  installed=$(sed -n 2p "$stamp")
fi
missing=""
for extra in ${extras//,/ }; do
  [[ ",$installed," == *",$extra,"* ]] || missing=1
done
if [ -z "$missing" ]; then
  exec .venv/bin/python scripts/fetch_demo_model.py
fi
has() { .venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('$1') is None)"; }
# torch first, through pip: pip finds a local CPU build where the machine has one (find-links),
# uv would take PyPI's CUDA build. The pin is the one in pyproject.toml's diffusion extra.
if [[ ",$extras," == *",diffusion,"* || ",$extras," == *",transformers,"* || ",$extras," == *",realtime,"* ]] \
    && ! has torch; then
  torch=$(.venv/bin/python -c "import tomllib; print(next(r for r in tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['diffusion'] if r.startswith('torch')))")
  # --no-compile: pip would compile all 2,285 of torch's modules (11 s here); the 725 an
  # import of torch reads are compiled by the first process that imports them
  "${pip[@]}" --no-deps --no-compile "$torch"
fi
if [ ! -x .venv/bin/uv ]; then
  "${pip[@]}" uv || echo "setup: uv could not be installed; installing with pip" >&2
fi
# Prebuilt wheels only (llama.cpp comes as xllamacpp); the optional llama-cpp-python extra compiles.
if [ -x .venv/bin/uv ] && .venv/bin/uv pip install --quiet --python .venv/bin/python pip -e ".[${extras}]"; then
  :
else
  "${pip[@]}" --upgrade pip wheel
  "${pip[@]}" -e ".[${extras}]"
fi
union=$(printf "%s\n" ${installed//,/ } ${extras//,/ } | sort -u | paste -sd, -)
printf "%s\n%s\n" "$digest" "$union" > "$stamp"
.venv/bin/python scripts/fetch_demo_model.py
