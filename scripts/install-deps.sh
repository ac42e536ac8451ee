#!/usr/bin/env bash
# Installs what the tests need and a fresh machine may lack: redis-server and redis-cli
# (the Redis tests start their own servers), python3 (.ci/run's MSRV check), and Chromium
# (admin/examples/admin.rs's browser test drives the admin page in it).
# Idempotent: does nothing when all is present.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
# .ci/run's MSRV check (scripts/msrv.py).
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# The admin page's browser test (admin/examples/admin.rs, crate tollgate-admin) runs Debian's headless Chromium.
[ -x /usr/bin/chromium ] || missing+=(chromium)

if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Fail loudly rather than let Redis tests skip.
redis-server --version >/dev/null
redis-cli --version >/dev/null
/usr/bin/chromium --version >/dev/null 2>&1
