# Sourced by the extra venvs' set-up scripts (setup-sglang, setup-vllm, setup-frameworks): uv, pinned
# and installed from PyPI into each venv, installs in seconds what pip took minutes for (vLLM's CPU
# build: 285 s with pip, 27 s with uv, both from empty caches; crewai's 137 packages: 7.7 min, 30 s).
# uv reads no pip.conf, so this machine's folder of wheels on disk (/opt/wheels, where the
# torch 2.13.0+cpu wheel lies) is passed as --find-links when it exists.
UV_VERSION=0.13.9
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
[ -z "${SSL_CERT_FILE:-}" ] && [ -f /etc/ssl/certs/ca-certificates.crt ] && export SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt

uv_venv() {  # uv_venv VENV: VENV exists and has uv in it
  local venv=$1
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  [ -x "$venv/bin/uv" ] || "$venv/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
}

uv_install() {  # uv_install VENV PIP-INSTALL-ARGS...
  local venv=$1
  shift
  local links=()
  [ -d /opt/wheels ] && links=(--find-links /opt/wheels)
  "$venv/bin/uv" pip install -q --python "$venv/bin/python" "${links[@]}" "$@"
}
