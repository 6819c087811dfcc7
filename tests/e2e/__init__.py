"""End-to-end tests: the Helm chart installed on the local cluster with a real container runtime."""
