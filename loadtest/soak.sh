#!/usr/bin/env bash
# The soak, for as long as asked: a release `rolter` in front of three mock engines under
# mixed streaming and non-streaming load while an engine is killed and comes back, another
# answers 503, a third resets its streams, clients abandon streams and the configuration
# reloads (the schedule is in loadtest/soak/src/lib.rs). Prints the report: requests sent,
# answered, failed by the reason the client saw, lost (must be 0), and the gateway's open
# descriptors and resident memory at the start, the middle and the end. Loopback only.
#
#   loadtest/soak.sh [--duration 30m] [--clients 16] [--workers 2] [--out DIR] [--skip-build]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
ARGS=(); SKIP_BUILD=0
while [ $# -gt 0 ]; do
  case "$1" in
    --skip-build) SKIP_BUILD=1 ;;
    -h|--help) sed -n 2,9p "$0"; exit 0 ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[ $SKIP_BUILD = 1 ] || cargo build --release -q -p rolter -p rolter-soak
exec "$TARGET/release/rolter-soak" --rolter "$TARGET/release/rolter" "${ARGS[@]}"
