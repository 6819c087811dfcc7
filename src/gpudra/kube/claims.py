"""Reads the ResourceClaim the kubelet asks to prepare. I/O: the API server.

Every prepare reads its claim with a GET, which the API server answers from etcd with a quorum read:
the allocation prepare acts on is the newest one the API server has confirmed. A watch-fed cache
cannot promise that: the kubelet names a claim only by namespace, name and UID, and a standalone
claim keeps its UID when it is deallocated and allocated again elsewhere, so a lagging or dead watch
would hand a pod a GPU the scheduler no longer gives it. A GET per prepared claim also keeps each
node's API load to its own claims, whatever the size of the cluster, and holds no claim in memory.
"""

from __future__ import annotations

from gpudra.errors import ClaimError
from gpudra.kube.client import Kube, NotFound
from gpudra.model.claim import Claim, read_claim


class ClaimReader:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.gets = 0  # for the metrics

    def get(self, *, namespace: str, name: str, uid: str) -> Claim:
        """The claim as the API server has it now; prepare checks that its UID is `uid`."""
        self.gets += 1
        try:
            return read_claim(self.kube.get_claim(namespace, name))
        except NotFound as err:
            raise ClaimError(f"ResourceClaim {namespace}/{name} not found") from err
