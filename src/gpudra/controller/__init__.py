"""`gpudra controller`, the cluster-wide half of gpudra (a Deployment): the admission webhook for gpudra
configs, the cluster's GPU picture (metrics and the JSON `gpudra status` reads), leader election, and
housekeeping. It shares `model`, `api` and `kube` with the node plugin and nothing of `node`."""
