"""plan_sync and SliceController: what gets written to the API server, how the pool is watched, and how
failures are retried."""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import urllib3
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudra.errors import ClusterError
from gpudra.kube.client import Obj, SkippedObjects, Watch
from gpudra.kube.slice_sync import (
    MAX_GENERATION,
    SliceController,
    SyncPlan,
    content,
    plan_sync,
)
from gpudra.model import health_report
from tests.unit.claims import DRIVER, NODE
from tests.unit.harness.api_client import FakeResponse
from tests.unit.harness.kube import NODE_UID, FakeSliceKube
from tests.unit.harness.slices import MODELS, Model, builder, controller, generations, wait_until


def listed(kube: FakeSliceKube) -> list[Obj]:
    return kube.list_slices(driver=DRIVER, node_name=NODE)[0]


def stranger(generation: int, name: str = "someone-elses-slice") -> Obj:
    """A slice in this node's pool that gpudra did not make."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": generation, "resourceSliceCount": 1},
            "devices": [{"name": "fake-gpu"}],
        },
    }


def retitle(name: str) -> Callable[[Obj], None]:
    """Someone else's edit of a slice's content that keeps every label and annotation."""

    def change(piece: Obj) -> None:
        piece["metadata"].setdefault("annotations", {})["gpudra.io/spec-hash"] = "kept by the editor"
        devices = piece["spec"].get("devices")
        if devices:
            devices[0]["attributes"]["productName"] = {"string": f"not what gpudra said ({name})"}
        else:
            piece["spec"]["sharedCounters"][0]["counters"].popitem()

    return change


def regenerate(generation: int) -> Callable[[Obj], None]:
    """Someone else's edit of a slice's pool generation."""

    def change(piece: Obj) -> None:
        piece["spec"]["pool"]["generation"] = generation

    return change


def published_pool(name: str = "h100") -> tuple[FakeSliceKube, SliceController]:
    """A FakeSliceKube holding `name`'s pool as a controller published it, and that controller."""
    kube = FakeSliceKube()
    slices, _ = controller(kube, Model(MODELS[name]))
    slices.sync_once()
    return kube, slices


# --- plan_sync ---------------------------------------------------------------------------------


def test_first_publish_creates_every_slice_with_generation_one() -> None:
    plan = plan_sync(builder(MODELS["h100"]), [], {})
    expected = builder(MODELS["h100"])(1)
    assert (plan.generation, len(plan.create), plan.update, plan.delete) == (1, len(expected), [], [])
    assert len(expected) > 1
    assert plan.create == expected  # nothing added: no annotation, no marker of any kind


def test_an_unchanged_pool_plans_no_writes_despite_server_defaults() -> None:
    kube, slices = published_pool()
    existing = listed(kube)
    assert any(s["spec"]["perDeviceNodeSelection"] is None for s in existing)  # the server's additions
    assert any(
        s["spec"] != content(p)["spec"] for s, p in zip(existing, builder(MODELS["h100"])(1), strict=True)
    )
    again = plan_sync(builder(MODELS["h100"]), existing, slices.published)
    assert again == SyncPlan(generation=1)
    assert again.writes == 0


def test_an_edited_slice_is_restored_at_the_same_generation_though_its_annotations_were_kept() -> None:
    kube, slices = published_pool()
    victim = sorted(kube.slices)[-1]
    kube.edit(victim, retitle(victim))
    plan = plan_sync(builder(MODELS["h100"]), listed(kube), slices.published)
    assert (plan.generation, plan.create, plan.delete) == (1, [], [])
    assert [p["metadata"]["name"] for p in plan.update] == [victim]
    assert plan.update[0]["metadata"]["resourceVersion"] == kube.slices[victim]["metadata"]["resourceVersion"]
    assert content(plan.update[0]) == slices.published[victim].sent


def test_a_change_to_metadata_only_is_no_difference() -> None:
    kube, slices = published_pool()
    for name in kube.slices:
        kube.edit(name, lambda s: s["metadata"].setdefault("labels", {}).update(team="infra"))
    assert plan_sync(builder(MODELS["h100"]), listed(kube), slices.published).writes == 0


def test_a_deleted_slice_is_created_again_at_the_same_generation() -> None:
    kube, slices = published_pool()
    victim = sorted(kube.slices)[0]
    kube.remove(victim)
    plan = plan_sync(builder(MODELS["h100"]), listed(kube), slices.published)
    assert (plan.generation, plan.update, plan.delete) == (1, [], [])
    assert [p["metadata"]["name"] for p in plan.create] == [victim]


def test_a_foreign_slice_at_the_largest_generation_is_deleted_and_ours_keep_theirs() -> None:
    kube, slices = published_pool()
    kube.add(stranger(MAX_GENERATION))
    plan = plan_sync(builder(MODELS["h100"]), listed(kube), slices.published)
    assert plan == SyncPlan(generation=1, delete=["someone-elses-slice"])


def test_with_nothing_remembered_the_next_generation_counts_our_slices_only() -> None:
    kube, _ = published_pool()
    kube.add(stranger(MAX_GENERATION))
    kube.add(stranger(7, "another-stranger"))
    plan = plan_sync(builder(MODELS["h100"]), listed(kube), {})
    assert plan.generation == 2
    assert plan.delete == ["another-stranger", "someone-elses-slice"]
    assert sorted(p["metadata"]["name"] for p in plan.update) == sorted(set(kube.slices) - set(plan.delete))


def test_our_own_generation_at_the_int64_limit_starts_the_pool_again_at_one() -> None:
    kube, slices = published_pool()
    for name in kube.slices:
        kube.edit(name, regenerate(MAX_GENERATION))
    for remembered in ({}, slices.published):
        model = MODELS["h100 newer driver"] if remembered else MODELS["h100"]
        plan = plan_sync(builder(model), listed(kube), remembered)
        # nothing remembered, or a changed model: every slice is rewritten, at 1 since MAX has no next
        assert plan.generation == 1 and len(plan.update) == len(kube.slices)
        assert {p["spec"]["pool"]["generation"] for p in plan.update} == {1}


def test_a_changed_model_rewrites_every_slice_with_the_next_generation() -> None:
    kube, slices = published_pool()
    versions = {name: s["metadata"]["resourceVersion"] for name, s in kube.slices.items()}
    plan = plan_sync(builder(MODELS["h100 newer driver"]), listed(kube), slices.published)
    assert (plan.generation, plan.create, plan.delete) == (2, [], [])
    assert {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in plan.update} == versions
    assert {p["spec"]["pool"]["generation"] for p in plan.update} == {2}


def test_a_model_change_confined_to_one_slice_keeps_the_generation() -> None:
    kube, slices = published_pool()
    changed = copy.deepcopy(MODELS["h100"])
    changed.devices[0]["attributes"]["productName"] = {"string": "NVIDIA H100 80GB HBM3 (renamed)"}
    plan = plan_sync(builder(changed), listed(kube), slices.published)
    assert (plan.generation, plan.create, plan.delete, len(plan.update)) == (1, [], [], 1)
    assert plan.update[0]["spec"]["devices"][0]["attributes"]["productName"]["string"].endswith("(renamed)")


def test_a_health_report_alone_updates_the_first_slice_and_keeps_the_generation() -> None:
    """The report (gpudra.model.health_report) is content: written, and restored after another's edit."""
    kube, slices = published_pool()
    reported = dataclasses.replace(MODELS["h100"], annotations={health_report.ANNOTATION: '{"devices": []}'})
    plan = plan_sync(builder(reported), listed(kube), slices.published)
    assert (plan.generation, plan.create, plan.delete, len(plan.update)) == (1, [], [], 1)
    [first] = plan.update
    assert first["metadata"]["name"] == sorted(kube.slices)[0]
    assert first["metadata"]["annotations"] == {health_report.ANNOTATION: '{"devices": []}'}
    edited, reporting = published_pool()
    reporting.model = lambda: reported
    reporting.sync_once()
    name = sorted(edited.slices)[0]
    edited.edit(name, lambda s: s["metadata"]["annotations"].pop(health_report.ANNOTATION))
    [restored] = plan_sync(builder(reported), listed(edited), reporting.published).update
    assert restored["metadata"]["annotations"] == {health_report.ANNOTATION: '{"devices": []}'}


def test_fewer_slices_delete_the_extras() -> None:
    kube, slices = published_pool("big")
    before = sorted(kube.slices)
    plan = plan_sync(builder(MODELS["mixed"]), listed(kube), slices.published)
    assert [p["metadata"]["name"] for p in plan.update] == before[:1]
    assert plan.create == []
    assert plan.delete == sorted(set(before) - set(before[:1]))
    assert plan.generation == 1  # one update: deletes, then it, leave the scheduler old or new, never a mix


def test_more_slices_create_the_new_ones() -> None:
    kube, slices = published_pool("mixed")
    plan = plan_sync(builder(MODELS["big"]), listed(kube), slices.published)
    assert len(plan.update) == 1 and len(plan.create) == len(builder(MODELS["big"])(1)) - 1
    assert {p["spec"]["pool"]["generation"] for p in plan.create + plan.update} == {1}  # one update again


def test_a_pool_left_half_rewritten_is_rewritten_at_a_newer_generation() -> None:
    kube, slices = published_pool()
    first = sorted(kube.slices)[0]
    kube.edit(first, regenerate(3))  # got through before a crash
    after_restart = plan_sync(builder(MODELS["h100"]), listed(kube), {})
    assert after_restart.generation == 4 and len(after_restart.update) == len(kube.slices)
    # while the controller still runs, that is someone else's edit of one slice: only it is restored
    running = plan_sync(builder(MODELS["h100"]), listed(kube), slices.published)
    assert running.generation == 1 and [p["metadata"]["name"] for p in running.update] == [first]


@settings(max_examples=15, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["h100", "h100 newer driver", "mixed", "empty"]), st.sampled_from([34, 35])
        ),
        min_size=1,
        max_size=4,
    )
)
def test_publishing_any_sequence_of_models(steps: list[tuple[str, int]]) -> None:
    """Each sync leaves exactly the built slices at one generation; a change of more than one existing
    slice bumps it, and nothing else does."""
    kube = FakeSliceKube()
    model = Model(MODELS[steps[0][0]])
    slices, _ = controller(kube, model)
    generation, previous = 0, None
    for name, minor in steps:
        model.current, kube.minor = MODELS[name], minor
        slices._server_minor = None  # as after a failure: the server may have been upgraded
        wanted = builder(MODELS[name], minor)(0)
        changed = wanted != previous
        first = not slices.published
        plan = slices.sync_once()
        generation += 1 if first or len(plan.update) > 1 else 0
        assert plan.generation == generation
        assert (plan.writes > 0) == changed
        assert generations(kube) == {generation}
        assert sorted(kube.slices) == sorted(s["metadata"]["name"] for s in wanted)
        assert slices.sync_once().writes == 0
        previous = wanted


DAMAGE = st.one_of(
    st.tuples(st.just("edit"), st.integers(0, 20)),
    st.tuples(st.just("delete"), st.integers(0, 20)),
    st.tuples(st.just("label"), st.integers(0, 20)),
    st.tuples(st.just("generation"), st.integers(0, 20), st.integers(0, MAX_GENERATION)),
    st.tuples(st.just("stranger"), st.integers(0, 20), st.integers(0, MAX_GENERATION)),
)


@settings(max_examples=20, deadline=None)
@given(damage=st.lists(DAMAGE, min_size=1, max_size=6))
def test_any_damage_by_others_is_repaired_and_then_costs_nothing(damage: list[tuple[Any, ...]]) -> None:
    kube, slices = published_pool()
    names = sorted(s["metadata"]["name"] for s in builder(MODELS["h100"])(1))
    for kind, index, *value in damage:
        name = names[index % len(names)]
        if kind == "stranger":
            kube.add(stranger(value[0], f"stranger-{index}"))
        elif name not in kube.slices:
            continue
        elif kind == "edit":
            kube.edit(name, retitle(name))
        elif kind == "delete":
            kube.remove(name)
        elif kind == "label":
            kube.edit(name, lambda s: s["metadata"].setdefault("labels", {}).update(x="y"))
        else:
            kube.edit(name, regenerate(value[0]))
    remembered = slices.published
    damaged = [n for n in names if n in kube.slices and content(kube.slices[n]) != remembered[n].stored]
    ours = max((kube.slices[n]["spec"]["pool"]["generation"] for n in names if n in kube.slices), default=0)
    plan = slices.sync_once()
    if len(damaged) <= 1:  # restored in place, the pool keeps its generation
        assert plan.generation == 1 and len(plan.update) == len(damaged)
    else:  # rewritten at the next generation of our own slices, never past int64
        assert plan.generation == (ours + 1 if ours < MAX_GENERATION else 1)
    assert sorted(kube.slices) == names
    wanted = builder(MODELS["h100"])(plan.generation)
    server_form = [content(FakeSliceKube.server_form(dict(s), uid="", version=0)) for s in wanted]
    assert [content(kube.slices[n]) for n in names] == server_form
    assert slices.sync_once().writes == 0


# --- SliceController ---------------------------------------------------------------------------


def test_sync_once_publishes_then_writes_nothing() -> None:
    kube, model = FakeSliceKube(), Model(MODELS["h100"])
    slices, published = controller(kube, model)
    first = slices.sync_once()
    count = len(builder(MODELS["h100"])(1))
    assert len(first.create) == count and published == ["create"] * count
    owners = {s["metadata"]["ownerReferences"][0]["uid"] for s in kube.slices.values()}
    assert owners == {NODE_UID}

    calls = len(kube.calls)
    assert slices.sync_once().writes == 0
    assert kube.calls[calls:] == ["list"]  # server version and node UID are remembered
    assert len(published) == count


def test_a_restarted_controller_adopts_an_unchanged_pool_without_writing() -> None:
    kube, _ = published_pool()
    versions = {name: s["metadata"]["resourceVersion"] for name, s in kube.slices.items()}
    writes = len(kube.writes)
    restarted, published = controller(kube, Model(MODELS["h100"]))
    assert restarted.sync_once() == SyncPlan(generation=1)
    assert len(kube.writes) == writes
    assert [c for c in kube.calls if c.startswith("dry-run")] == [f"dry-run replace {n}" for n in kube.slices]
    assert {name: s["metadata"]["resourceVersion"] for name, s in kube.slices.items()} == versions
    assert published == []
    calls = len(kube.calls)
    assert restarted.sync_once().writes == 0 and kube.calls[calls:] == ["list"]  # adopted once


def test_a_restarted_controller_writes_only_what_changed_while_it_was_down() -> None:
    kube, _ = published_pool()
    edited, deleted = sorted(kube.slices)[0], sorted(kube.slices)[-1]
    kube.edit(edited, retitle(edited))
    kube.remove(deleted)
    restarted, published = controller(kube, Model(MODELS["h100"]))
    plan = restarted.sync_once()
    assert plan.generation == 1 and published == ["update", "create"]
    assert [p["metadata"]["name"] for p in plan.update + plan.create] == [edited, deleted]
    assert generations(kube) == {1}
    assert restarted.sync_once().writes == 0


def test_a_restarted_controller_with_a_changed_model_rewrites_the_pool() -> None:
    kube, _ = published_pool()
    restarted, _ = controller(kube, Model(MODELS["h100 newer driver"]))
    plan = restarted.sync_once()
    assert plan.generation == 2 and len(plan.update) == len(kube.slices)
    assert restarted.sync_once().writes == 0


def test_a_slice_whose_create_reply_was_lost_is_adopted_not_rewritten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = FakeSliceKube()
    slices, published = controller(kube, Model(MODELS["h100"]))
    create = kube.create_slice

    def create_then_time_out(body: Obj) -> Obj:
        stored = create(body)
        if len(kube.slices) == 2:
            raise ClusterError("creating ResourceSlice: timed out (ReadTimeoutError)")
        return stored

    monkeypatch.setattr(kube, "create_slice", create_then_time_out)
    with pytest.raises(ClusterError, match="timed out"):
        slices.sync_once()
    plan = slices.sync_once()
    assert (
        plan.generation == 1 and plan.update == [] and len(plan.create) == len(builder(MODELS["h100"])(1)) - 2
    )
    assert not [c for c in kube.calls if c.startswith("replace")]
    assert sorted(slices.published) == sorted(kube.slices) and generations(kube) == {1}
    assert published.count("create") == len(kube.slices) - 1  # the lost reply was never counted


def test_sync_once_updates_after_a_model_change_and_deletes_extras() -> None:
    kube, model = FakeSliceKube(), Model(MODELS["big"])
    slices, published = controller(kube, model)
    slices.sync_once()
    model.current = MODELS["h100 newer driver"]
    plan = slices.sync_once()
    assert generations(kube) == {2}
    assert published.count("update") == len(plan.update) > 0
    assert published.count("delete") == len(plan.delete) > 0
    assert sorted(kube.slices) == sorted(s["metadata"]["name"] for s in builder(model.current)(2))
    assert sorted(slices.published) == sorted(kube.slices)


def test_sync_once_raises_a_write_failure() -> None:
    kube, model = FakeSliceKube(), Model(MODELS["mixed"])
    slices, _ = controller(kube, model)
    kube.failures = [None, None, None, ClusterError("creating ResourceSlice: HTTP 500")]
    with pytest.raises(ClusterError, match="HTTP 500"):
        slices.sync_once()
    assert slices.published == {}  # nothing recorded for a write that did not happen


def test_the_controller_exposes_both_loops() -> None:
    slices, _ = controller(FakeSliceKube(), Model(MODELS["mixed"]))
    assert [loop.name for loop in slices.loops] == ["slice-sync", "slice-watch"]


def test_the_thread_retries_with_backoff_and_resets_it_after_a_success() -> None:
    kube, model = FakeSliceKube(), Model(MODELS["mixed"])
    slices, _ = controller(kube, model, resync_seconds=0.1)
    down = ClusterError("listing ResourceSlices: connection refused")
    # attempts 1 and 2 fail at the list; 3 lists and creates; 4 (cluster facts remembered) fails; 5 works
    kube.failures = [None, None, down, None, None, down, None, None, None, None, down]
    slices.loop.start()  # no watch: every sync LISTs, where the failures are
    try:
        assert slices.synced.wait(5)
        deadline = time.monotonic() + 5
        while len(kube.times) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        slices.stop(5)
    assert not slices.loop.alive
    gaps = [later - earlier for earlier, later in zip(kube.times, kube.times[1:], strict=False)]
    # A wait never ends early, so the lower bounds are exact; a loaded machine only adds to a gap. The
    # upper bounds tell a reset backoff from the one that goes on (2 s after 0.5 and 1), with 1.4 s
    # for the load.
    assert gaps[0] >= 0.45  # first retry after 0.5 s
    assert gaps[1] >= 0.95  # then 1 s
    assert gaps[2] < 1.9  # a success: the next sync after resync_seconds (0.1 s), not a backoff
    assert 0.45 <= gaps[3] < 1.9  # the backoff starts again at 0.5 s, not at 2
    # cluster facts are read again after each failure: the node or server may have changed
    assert kube.calls.count("server_minor") == 4
    assert len(kube.slices) == 1


def test_trigger_syncs_early_and_stop_ends_both_threads() -> None:
    kube, model = FakeSliceKube(), Model(MODELS["h100"])
    slices, published = controller(kube, model, resync_seconds=60)
    slices.start()
    try:
        assert slices.synced.wait(5)
        wait_until(lambda: "watch" in kube.watch_calls)  # a watch is open and waiting
        model.current = MODELS["h100 newer driver"]
        slices.trigger()
        wait_until(lambda: generations(kube) == {2})
    finally:
        started = time.monotonic()
        slices.stop(60)
    # The watch and the 60 s resync both end at once: a thread that held the stop would take its 60 s.
    assert time.monotonic() - started < 30
    assert not any(loop.alive for loop in slices.loops)
    assert "update" in published


def test_stop_without_start() -> None:
    slices, _ = controller(FakeSliceKube(), Model(MODELS["mixed"]))
    slices.stop(5)
    assert not slices.synced.is_set()


def test_the_thread_is_not_synced_until_a_sync_succeeds() -> None:
    kube, model = FakeSliceKube(), Model(MODELS["mixed"])
    slices, _ = controller(kube, model)
    kube.failures = [ClusterError("reading the server version: HTTP 503")]
    slices.start()
    try:
        assert not slices.synced.wait(0.2)
        assert slices.synced.wait(3)
    finally:
        slices.stop(5)


# --- the watch ---------------------------------------------------------------------------------


@pytest.fixture
def running() -> Iterator[tuple[FakeSliceKube, SliceController, list[str]]]:
    """A controller whose resync (an hour) cannot explain anything a test sees within seconds."""
    kube = FakeSliceKube()
    slices, published = controller(kube, Model(MODELS["h100"]), resync_seconds=3600)
    slices.start()
    try:
        assert slices.synced.wait(5)
        wait_until(lambda: "watch" in kube.watch_calls and kube.consumed == len(kube.events))
        yield kube, slices, published
    finally:
        slices.stop(5)
    assert not any(loop.alive for loop in slices.loops)


def test_the_watch_restores_a_deleted_slice_within_seconds(
    running: tuple[FakeSliceKube, SliceController, list[str]],
) -> None:
    kube, _, published = running
    victim, writes = sorted(kube.slices)[0], len(published)
    kube.remove(victim)
    wait_until(lambda: victim in kube.slices and len(published) > writes)
    assert published[writes:] == ["create"]
    assert kube.slices[victim]["spec"]["pool"]["generation"] == 1


def test_the_watch_restores_an_edited_slice_and_deletes_a_stranger(
    running: tuple[FakeSliceKube, SliceController, list[str]],
) -> None:
    kube, slices, published = running
    victim, writes = sorted(kube.slices)[-1], len(published)
    kube.edit(victim, retitle(victim))
    wait_until(lambda: content(kube.slices[victim]) == slices.published[victim].stored)
    kube.add(stranger(MAX_GENERATION))
    wait_until(lambda: "someone-elses-slice" not in kube.slices and len(published) > writes + 1)
    assert published[writes:] == ["update", "delete"]
    assert generations(kube) == {1}
    assert slices.watch_loop.failures == 0 and slices.loop.failures == 0


def test_the_watch_takes_no_write_of_the_controller_for_someone_elses(
    running: tuple[FakeSliceKube, SliceController, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    kube, slices, published = running
    with caplog.at_level(logging.INFO, logger="gpudra.kube.slice_sync"):
        model = slices.model
        assert isinstance(model, Model)
        model.current = MODELS["h100 newer driver"]
        slices.trigger()
        wait_until(lambda: generations(kube) == {2} and kube.consumed == len(kube.events))
        first = sorted(kube.slices)[0]
        kube.edit(first, retitle(first))
        wait_until(
            lambda: (
                content(kube.slices[first]) == slices.published[first].stored
                and kube.consumed == len(kube.events)
            )
        )
    noticed = [r for r in caplog.records if r.getMessage().startswith("ResourceSlice changed")]
    assert [(r.__dict__["change"], r.__dict__["resourceslice"]) for r in noticed] == [("MODIFIED", first)]
    assert published.count("update") == len(kube.slices) + 1  # the rewrite, then the one restore


def test_a_failing_watch_starts_again_from_a_list_and_is_counted(
    running: tuple[FakeSliceKube, SliceController, list[str]],
) -> None:
    kube, slices, _ = running
    kube.watch_failures = [ClusterError("watching ResourceSlices: HTTP 410 Expired")]
    opened = kube.watch_calls.count("watch")
    assert kube.opened is not None
    kube.opened.close()  # the API server ends the watch; opening the next one fails
    wait_until(lambda: kube.watch_calls.count("watch") == opened + 2)
    assert slices.watch_loop.failures == 1
    assert kube.watch_calls[-3:] == ["watch", "list", "watch"]  # the failed one, a fresh list, a new one
    victim = sorted(kube.slices)[0]
    kube.remove(victim)
    wait_until(lambda: victim in kube.slices)


# --- Watch: the client's side of a WATCH ---------------------------------------------------


def test_a_watch_yields_events_split_across_chunks_and_closes_its_response() -> None:
    response = FakeResponse(
        chunks=[
            b'{"type": "ADDED", "object": {"metadata": {"na',
            b'me": "a"}}}\n\n{"type": "BOO',
            b'KMARK", "object": {}}\n',
        ]
    )
    assert [
        e["type"] for e in Watch(response, "watching ResourceSlices", "resourceslices", SkippedObjects())
    ] == ["ADDED", "BOOKMARK"]
    assert response.closed


def test_an_error_event_or_a_broken_stream_is_a_cluster_error() -> None:
    expired = FakeResponse(
        chunks=[b'{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}\n']
    )
    with pytest.raises(ClusterError, match="watching ResourceSlices: HTTP 410 too old"):
        list(Watch(expired, "watching ResourceSlices", "resourceslices", SkippedObjects()))
    broken = FakeResponse(chunks=[], end=urllib3.exceptions.ProtocolError("Connection broken"))
    with pytest.raises(ClusterError, match="connection broken"):
        list(Watch(broken, "watching ResourceSlices", "resourceslices", SkippedObjects()))
    assert expired.closed and broken.closed


def test_a_closed_watch_ends_quietly() -> None:
    broken = FakeResponse(
        chunks=[b'{"type": "ADDED", "object": {}}\n'], end=urllib3.exceptions.ProtocolError("shut")
    )
    watch = Watch(broken, "watching ResourceSlices", "resourceslices", SkippedObjects())
    events = iter(watch)
    assert next(events)["type"] == "ADDED"
    watch.close()  # from another thread, in the plugin: the read it interrupts fails
    assert list(events) == [] and broken.shut and broken.closed


def test_an_idle_pool_costs_no_request_once_the_watch_runs() -> None:
    """Every resync reads the pool from the watch's picture: no LIST, no write, however many there are."""
    kube = FakeSliceKube()
    slices, published = controller(kube, Model(MODELS["h100"]), resync_seconds=0.02)
    slices.start()
    try:
        assert slices.synced.wait(5)
        wait_until(lambda: "watch" in kube.watch_calls and kube.consumed == len(kube.events))
        time.sleep(0.2)  # the echoes of the first writes reach the picture
        calls, lists = len(kube.calls), kube.watch_calls.count("list")
        time.sleep(1.0)  # 50 resync periods
        assert kube.calls[calls:] == []
        assert kube.watch_calls.count("list") == lists
        # The picture follows someone else's change, and the sync that it wakes restores the slice.
        victim = sorted(kube.slices)[0]
        kube.edit(victim, retitle(victim))
        wait_until(lambda: content(kube.slices[victim]) == slices.published[victim].stored)
        assert "list" not in kube.calls[calls:]
    finally:
        slices.stop(5)
    assert published.count("update") == 1


def test_a_write_between_the_watchs_list_and_its_picture_is_not_lost() -> None:
    """The watch LISTs without the write lock; a sync that writes before the listed picture is stored
    must not be forgotten (the picture would be stale while no echo is pending, and the next sync would
    plan from it: a create of an existing slice or a replace with an old resourceVersion, a Conflict)."""
    kube = FakeSliceKube()
    model = Model(MODELS["h100"])
    slices, _ = controller(kube, model)
    slices.sync_once()
    list_slices = kube.list_slices
    raced: list[bool] = []

    def list_then_write(*, driver: str, node_name: str) -> tuple[list[Obj], str]:
        listed = list_slices(driver=driver, node_name=node_name)
        if not raced:
            raced.append(True)
            model.current = MODELS["h100 newer driver"]
            slices.sync_once()  # writes after the LIST, before the watch stores what it listed
        return listed

    kube.list_slices = list_then_write
    slices._watch_step()
    assert raced
    seen = slices._seen_pool()
    assert seen is None or {s["metadata"]["name"]: s for s in seen} == kube.slices
    writes = len(kube.writes)
    slices.sync_once()  # would raise Conflict from a stale picture
    assert len(kube.writes) == writes


def test_a_broken_watch_makes_the_next_sync_list() -> None:
    kube = FakeSliceKube()
    slices, _ = controller(kube, Model(MODELS["h100"]), resync_seconds=0.05)
    slices.start()
    try:
        assert slices.synced.wait(5)
        wait_until(lambda: "watch" in kube.watch_calls and kube.consumed == len(kube.events))
        kube.watch_failures = [ClusterError("watching ResourceSlices: HTTP 410 Gone")]
        assert kube.opened is not None
        kube.opened.close()  # the server ends the watch; the next one fails and starts from a LIST
        wait_until(lambda: kube.watch_calls.count("list") >= 2)
    finally:
        slices.stop(5)
    assert slices.watch_loop.failures == 1
