#!/bin/sh
# The node installer's pod (node-installer.yaml): install execgate on its host, register the
# `execgate` handler with the node's containerd or CRI-O, label the node; undo it all on a stop
# when EXECGATE_UNDO_ON_STOP=1. Privileged with hostPID and the host's / at /host: every step on
# the host runs in its namespaces (nsenter -t 1), with the host's own python3 and systemd.
set -eu
src=/var/lib/execgate/installer-src  # where the host sees this repo
engine=${EXECGATE_ENGINE:-auto}
label=execgate.io/installed

log() { echo "node-install: $*"; }
on_host() { nsenter --target 1 --mount --uts --ipc --net --pid -- "$@"; }

# The node's label, through the API with the pod's token (the admission policy lets it change
# only its own node's execgate.io/ labels). $1: "\"true\"" or null.
set_label() {
    sa=/var/run/secrets/kubernetes.io/serviceaccount
    curl -fsS --cacert "$sa/ca.crt" -H "Authorization: Bearer $(cat "$sa/token")" \
        -H "Content-Type: application/merge-patch+json" -X PATCH \
        -d "{\"metadata\":{\"labels\":{\"$label\":$1}}}" \
        "https://kubernetes.default.svc/api/v1/nodes/$NODE_NAME" >/dev/null
}

if [ "$engine" = auto ]; then
    if [ -S /host/run/containerd/containerd.sock ]; then engine=containerd
    elif [ -S /host/var/run/crio/crio.sock ] || [ -S /host/run/crio/crio.sock ]; then engine=crio
    else log "neither containerd's nor CRI-O's socket on this node"; exit 1
    fi
fi

undo() {
    log "stopping: taking $label off $NODE_NAME, then execgate out of $engine"
    set_label null || log "warning: could not remove the node label"
    on_host "$src/install.sh" --uninstall --engines "$engine" || log "warning: uninstall failed"
    on_host systemctl restart "$engine" || log "warning: $engine did not restart"
    rm -f /tmp/execgate-installed
    exit 0
}

mkdir -p "/host$src"
cp -a /opt/execgate-src/. "/host$src/"
on_host "$src/install.sh" --no-swap --engines "$engine"
on_host systemctl restart "$engine"
set_label '"true"'
touch /tmp/execgate-installed
log "execgate installed on $NODE_NAME for $engine; RuntimeClass execgate may run here"
if [ "${EXECGATE_UNDO_ON_STOP:-1}" = 1 ]; then
    trap undo TERM INT
else
    trap 'exit 0' TERM INT
fi
while :; do sleep 3600 & wait $! || true; done
