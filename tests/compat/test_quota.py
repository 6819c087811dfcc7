"""ResourceQuota on gpudra's DeviceClasses on each release `make compat` runs (1.34+): the API server
charges a claim's devices to `<class>.deviceclass.resource.k8s.io/devices` and refuses the claim that
would go over, with its own message. The claims are only created, never allocated, so the check holds
whatever the release serves (tests/integration/test_quota.py runs them on the pinned release)."""

from __future__ import annotations

import uuid

from kubernetes import client

from tests.localcluster.quota import apply_resource_quota, create_claim, device_claim, quota_resource


def test_a_namespace_at_its_gpu_quota_has_its_next_claim_refused(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    ns = f"quota-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    try:
        allowed = apply_resource_quota(api, ns)
        for device_class, count in allowed.items():
            stem = device_class.split(".")[0]
            for i in range(count):
                assert create_claim(api, ns, device_claim(f"{stem}-{i}", device_class)) == ""
            resource = quota_resource(device_class)
            assert create_claim(api, ns, device_claim(f"{stem}-over", device_class)) == (
                f'resourceclaims.resource.k8s.io "{stem}-over" is forbidden: exceeded quota: gpus, '
                f"requested: {resource}=1, used: {resource}={count}, limited: {resource}={count}"
            )
    finally:
        core.delete_namespace(ns)
