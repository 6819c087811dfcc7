"""Who is asking, and may they list ResourceClaims (or ResourceSlices): the API server's TokenReview and
SubjectAccessReview, the two calls kube-rbac-proxy makes in front of a workload; and the cluster's
namespaces, to ask about. I/O: the API server (through `Kube`).

The controller's `/status` is authorized with them (gpudra.controller.status_access), so the cluster's
own authentication (service-account tokens, OIDC, whatever the API server accepts) and RBAC decide
who sees which claims, and gpudra keeps no user list of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudra.kube.client import Kube
from gpudra.model.kube_api import GROUP

# The namespaces /status considers at most (one LIST page): past them a caller's rights are not looked for.
MAX_NAMESPACES = 1000


@dataclass(frozen=True)
class Caller:
    """An authenticated user as the TokenReview names it."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


class AccessReviews:
    """TokenReview and SubjectAccessReview through `api`."""

    def __init__(self, api: Kube) -> None:
        self.api = api

    def authenticate(self, token: str) -> Caller | None:
        """The user `token` belongs to, or None when the API server does not accept it (for its default
        audiences: the API server's own)."""
        reply = self.api.request(
            "reviewing a bearer token",
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
        )
        status = reply.get("status") or {}
        user = status.get("user") or {}
        if status.get("authenticated") is not True or not isinstance(user.get("username"), str):
            return None
        extra = user.get("extra") or {}
        return Caller(
            username=user["username"],
            uid=str(user.get("uid") or ""),
            groups=tuple(str(g) for g in user.get("groups") or ()),
            extra=tuple(sorted((str(k), tuple(str(v) for v in vs or ())) for k, vs in extra.items())),
        )

    def may_list(self, caller: Caller, resource: str, namespace: str) -> bool:
        """Whether RBAC (or the cluster's authorizer) lets `caller` list `resource` (of resource.k8s.io)
        in `namespace` ("": in every namespace, cluster-wide; the only one for a cluster-scoped resource)."""
        spec = {
            "user": caller.username,
            "uid": caller.uid,
            "groups": list(caller.groups),
            "extra": {key: list(values) for key, values in caller.extra},
            "resourceAttributes": {
                "verb": "list",
                "group": GROUP,
                "resource": resource,
                "namespace": namespace,
            },
        }
        reply = self.api.request(
            f"reviewing access to {resource}",
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            body={"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec},
        )
        return (reply.get("status") or {}).get("allowed") is True

    def namespaces(self) -> tuple[list[str], bool]:
        """The names of the cluster's namespaces, at most MAX_NAMESPACES (one page), and whether there
        are more. The API server has no review that answers "may this user list claims in *some*
        namespace" for another user (SelfSubjectRulesReview answers for the caller itself, and its API
        documentation says not to drive authorization decisions with it), so /status asks per
        namespace, and needs to know which there are."""
        page = self.api.list_page("namespaces", "/api/v1/namespaces", limit=MAX_NAMESPACES)
        names = [
            str(name)
            for item in page.get("items") or []
            if (name := (item.get("metadata") or {}).get("name"))
        ]
        return names, bool((page.get("metadata") or {}).get("continue"))
