#!/usr/bin/env bash
# flock adopted, upgraded from the previous version, rolled back, upgraded again and
# uninstalled with Helm on the running cluster of up.sh, under traffic; the last line is one
# JSON object (docs/cluster.md#upgrades).
exec "$(dirname "$0")/fkc.sh" upgrade "$@"
