"""The scheduler's side of DRA, ported: the CEL environment of device selectors, ResourceSlices and claims
as the scheduler reads them, its structured allocator, and what gpudra builds on it (`gpudra explain`, the
admission warnings' reach, the cluster view). Pure; the node plugin never imports it (.importlinter).
"""
