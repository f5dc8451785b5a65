#!/usr/bin/env bash
# The running cluster of up.sh switched to PodSlices with Helm (flock-controller --pod-slices,
# agents --pod-source slices) and checked: every peer pod in one slice, writes by anyone else
# refused by the admission policy, the writer present (docs/cluster.md#podslices). smoke.sh
# then runs the cluster's checks on slices; --off switches back.
exec "$(dirname "$0")/fkc.sh" slices "$@"
