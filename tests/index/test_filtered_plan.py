"""Filtered search at the filter shapes that broke it (nearsight.index.ann.filtered and
filter_plan): a cap and a group of clusters away from the queries, on HNSW and IVF-PQ, against a
float64 brute force over the allowed items; and the exact/index switch chosen by the costs.

The catalog: 20,000 unit vectors in 200 clusters (32-d). Before the cost plan (a fixed count of
2,048 allowed items, efSearch / nprobe widened by N / allowed) these filters of 30% of the items
came back with recall@10 0.70 (HNSW, cap), 0.57 (HNSW, category), 0.80 and 0.75 (IVF-PQ)."""

from __future__ import annotations

import numpy as np
import pytest

from nearsight.index.ann import filter_plan, filtered
from nearsight.index.ann.filter_plan import TARGET_RECALL, Costs
from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.write import write_gallery
from nearsight.search.searcher import open_gallery

COUNT, DIM, CLUSTERS, K, SHARE = 20_000, 32, 200, 10, 0.3
EXACT_CHEAP = Costs(0.0, 1e-9, 10.0, 1.0)  # every exact search costs less than any walk
WALK_CHEAP = Costs(10.0, 1.0, 0.0, 1e-9)  # the reverse: walk wherever a walk promises


@pytest.fixture(scope="module")
def data() -> dict:
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((CLUSTERS, DIM)).astype(np.float32)
    label = rng.integers(0, CLUSTERS, COUNT + 100)
    points = centres[label] + 0.35 * rng.standard_normal((COUNT + 100, DIM)).astype(np.float32)
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    vectors, queries = points[:COUNT], points[COUNT:]
    count = int(SHARE * COUNT)
    along = vectors @ rng.standard_normal(DIM).astype(np.float32)
    own = set(label[COUNT:].tolist())  # the queries' clusters: the category holds none
    away = [c for c in rng.permutation(CLUSTERS) if c not in own]
    sizes = np.bincount(label[:COUNT], minlength=CLUSTERS)
    group = away[: int(np.searchsorted(np.cumsum(sizes[away]), count)) + 1]
    filters = {
        "cap": np.sort(np.argsort(-along, kind="stable")[:count]),
        "category": np.flatnonzero(np.isin(label[:COUNT], group)),
        "random": np.sort(rng.choice(COUNT, count, replace=False)),
    }
    return {"vectors": vectors, "queries": queries, "filters": filters}


@pytest.fixture(scope="module")
def galleries(tmp_path_factory, data) -> dict:
    """The two galleries, and in ``"tuned"`` each build's index as the build handed it to
    tune_filters (built without the held-out sample, nprobe / efSearch tuned), with that
    call's meta and held-out sample: what test_the_tuning_walks_a_group_only_for_the_queries_
    outside_it would otherwise build again."""
    import copy

    import faiss

    from nearsight.index.gallery import write

    root = tmp_path_factory.mktemp("plan")
    items = [{"path": f"/shop/{i}.jpg"} for i in range(COUNT)]
    tuned: dict[str, tuple] = {}
    tune_filters = write.tune_filters

    def recorded(index, index_type, meta, vectors, ids, held_out, *args, **kwargs):
        tuned[index_type] = (faiss.serialize_index(index), copy.deepcopy(meta), held_out.copy())
        return tune_filters(index, index_type, meta, vectors, ids, held_out, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(write, "tune_filters", recorded)
        built = {
            index_type: write_gallery(root / index_type, data["vectors"], items,
                                      model_sha256="e" * 64, index_type=index_type)
            for index_type in ("hnsw", "ivfpq")
        }  # fmt: skip
    assert set(tuned) == set(built)
    return {**built, "tuned": tuned}


@pytest.fixture
def planned(monkeypatch) -> list[int]:
    """The number of queries of each filtered.plan_walk call from here on (a spy)."""
    calls: list[int] = []
    plan_walk = filtered.plan_walk

    def spy_plan(*args, **kwargs):
        calls.append(len(args[3]))
        return plan_walk(*args, **kwargs)

    monkeypatch.setattr(filtered, "plan_walk", spy_plan)
    return calls


def brute_force(queries: np.ndarray, vectors: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    scores = queries.astype(np.float64) @ vectors[allowed].astype(np.float64).T
    return allowed[np.argsort(-scores, axis=1, kind="stable")[:, :K]]


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / K for a, b in zip(found, truth, strict=True)]))


def walk_per_ef(folder) -> float:
    """ms per efSearch that makes a walk as dear as the exact search (1 ms) past ef 475 when
    the rule's alpha is 2, scaled by the gallery's alpha: the same local share is the break-even
    whatever alpha the build tuned (efSearch grows with alpha / local share)."""
    with Gallery.open(folder) as gallery:
        return 0.002 * 2 / float(gallery.meta["filter_route"]["alpha"])


def search(folder, data, name: str, costs: Costs | None = None) -> tuple[np.ndarray, dict]:
    allowed = data["filters"][name]
    with Gallery.open(folder) as gallery:
        if costs is not None:
            gallery._filters.costs = costs  # this machine's calibration, as a test sets it
        info: dict = {}
        _, ids = gallery.search(data["queries"], K, ids=allowed, info=info)
    assert np.isin(ids, allowed).all() and ids.shape == (len(data["queries"]), K)
    return ids, info


@pytest.mark.parametrize("index_type", ["hnsw", "ivfpq"])
@pytest.mark.parametrize("name", ["cap", "category"])
def test_a_filter_away_from_the_queries_keeps_its_recall(galleries, data, index_type, name):
    ids, info = search(galleries[index_type], data, name)
    truth = brute_force(data["queries"], data["vectors"], data["filters"][name])
    assert recall(ids, truth) >= 0.95
    assert info["exact"] + info["index"] == len(data["queries"]) and not info["notes"]


@pytest.mark.parametrize("index_type", ["hnsw", "ivfpq"])
@pytest.mark.parametrize("name", ["cap", "category", "random"])
def test_the_widened_walk_keeps_its_recall_where_it_is_taken(galleries, data, index_type, name):
    """Walks made cheap: every query the plan can walk within the target walks, widened by
    the stored rule; the rest (HNSW: no allowed item near the query) go exact."""
    ids, info = search(galleries[index_type], data, name, WALK_CHEAP)
    truth = brute_force(data["queries"], data["vectors"], data["filters"][name])
    assert info["index"] >= len(data["queries"]) // 4  # the walk is what is tested
    assert recall(ids, truth) >= 0.95
    if index_type == "ivfpq":  # lists holding allowed items: every query can walk
        assert info["index"] == len(data["queries"])


@pytest.mark.parametrize("index_type", ["hnsw", "ivfpq"])
def test_the_exact_or_index_switch_is_chosen_by_cost(galleries, data, index_type):
    """6,000 allowed items: the old fixed count (2,048) walked the index; with a calibration
    where the exact search is cheap the plan searches exactly (the true top-k), and with one
    where walking is cheap it walks."""
    ids, info = search(galleries[index_type], data, "random", EXACT_CHEAP)
    assert info["exact"] == len(data["queries"]) and info["index"] == 0
    truth = brute_force(data["queries"], data["vectors"], data["filters"]["random"])
    assert (ids == truth).mean() >= 0.99
    _, info = search(galleries[index_type], data, "random", WALK_CHEAP)
    assert info["index"] == len(data["queries"]) and info["exact"] == 0


def test_no_walk_is_planned_where_the_plan_and_the_narrowest_walk_cost_more_than_exact(
    galleries, data, planned
):
    """HNSW plans a walk with an unfiltered probe of the query's neighbourhood; where the
    exact search costs more than the narrowest walk but less than the probe and that walk
    together, the old rule probed anyway and paid for it whichever way the query then went.
    Now nothing is planned there and every query is exact; with a cheap probe it plans."""
    # exact 1 ms whatever the count, the narrowest walk 0.5 ms, the probe 0.8 ms
    dear_probe = Costs(1.0, 0.0, 0.5, 0.0, plan=0.8)
    ids, info = search(galleries["hnsw"], data, "random", dear_probe)
    assert planned == [] and info["exact"] == len(data["queries"])
    truth = brute_force(data["queries"], data["vectors"], data["filters"]["random"])
    assert (ids == truth).mean() >= 0.99
    _, info = search(galleries["hnsw"], data, "random", Costs(1.0, 0.0, 0.5, 0.0, plan=0.2))
    assert planned == [len(data["queries"])] and info["index"] == len(data["queries"])


def test_a_filter_whose_typical_query_does_not_repay_its_plan_stops_planning(
    galleries, data, planned
):
    """The category filter lies away from the queries: most of them find no allowed item
    near and go exact after their plan, while about a third walk, each saving several times
    what every query's plan costs, so planning lowers the mean, but the median query paid a
    plan for nothing (the old rule, by the mean, kept planning). After its first search the
    filter goes exact without the plan (planning again every EXPLORE_EVERY-th search); the
    random filter, whose every query walks, keeps planning. The answers are the true ones."""
    from nearsight.index.ann.filter_plan import EXPLORE_EVERY

    # exact 1 ms; a walk 0.05 ms + 2 us per efSearch at alpha 2 (past ef 475 it costs more
    # than exact; walk_per_ef); the gate 0.01 ms and the probe 0.1 ms
    costs = Costs(1.0, 0.0, 0.05, walk_per_ef(galleries["hnsw"]), plan=0.1, gate=0.01)
    queries, category = data["queries"], data["filters"]["category"]
    truth = brute_force(queries, data["vectors"], category)
    with Gallery.open(galleries["hnsw"]) as gallery:
        gallery._filters.costs = costs
        runs = []
        for _ in range(EXPLORE_EVERY + 1):
            info: dict = {}
            _, ids = gallery.search(queries, K, ids=category, info=info)
            runs.append((len(planned), info["index"]))
            assert recall(ids, truth) >= 0.95
        # a fifth to a half of the queries walk, and save more than all the gates and probes
        # (0.11 ms a query) cost: by the mean, planning pays
        assert runs[0][0] == 1 and len(queries) // 5 < runs[0][1] < len(queries) // 2
        # then no plan (every query exact) until the EXPLORE_EVERY-th skipped search
        assert [count for count, _ in runs[1:]] == [1] * (EXPLORE_EVERY - 1) + [2]
        assert all(walked == 0 for _, walked in runs[1:EXPLORE_EVERY])
        for _ in range(3):  # every query of the random filter walks: planning pays
            info = {}
            gallery.search(queries, K, ids=data["filters"]["random"], info=info)
            assert info["index"] == len(queries)
    assert len(planned) == 2 + 3


def test_filters_seen_once_each_stop_planning_once_their_family_shows_it_does_not_pay(
    galleries, data, planned
):
    """One query a search, each with a filter of its own (the category away from the
    queries, less a few items: a new fingerprint every time, the same share): no filter is
    seen twice, so none could learn from its own history. After MIN_PLANNED planned queries
    their family (the filters of about that share) shows that most do not repay the plan, and
    the rest go exact but for every EXPLORE_EVERY-th search. The answers are the true ones."""
    from nearsight.index.ann.filter_plan import EXPLORE_EVERY, MIN_PLANNED

    costs = Costs(1.0, 0.0, 0.05, walk_per_ef(galleries["hnsw"]), plan=0.1, gate=0.01)
    queries, category = data["queries"], data["filters"]["category"]
    hits = 0
    with Gallery.open(galleries["hnsw"]) as gallery:
        gallery._filters.costs = costs
        for q, query in enumerate(queries):
            allowed = category[: len(category) - 1 - q]  # a filter of its own
            _, ids = gallery.search(query[None], K, ids=allowed)
            hits += len(set(ids[0]) & set(brute_force(query[None], data["vectors"], allowed)[0]))
    assert hits >= 0.95 * K * len(queries)
    rest = len(queries) - MIN_PLANNED
    assert planned[:MIN_PLANNED] == [1] * MIN_PLANNED
    assert len(planned) <= MIN_PLANNED + rest // EXPLORE_EVERY + 1  # was: every search


def test_gate_misses_go_exact_without_a_probe_once_their_probes_do_not_pay(
    galleries, data, monkeypatch
):
    """The cap lies away from most queries. The searches here hold every query whose gate
    finds an allowed item near (a hit; most of them walk, and the filter is planned) and 20
    whose gate finds none (misses: their probes find few allowed items, and a walk that
    wide would cost about what the exact search does). The first search probes every query;
    the next probes only the hits, and the answers stay the true ones. Before the gate every
    query of every planned search paid the full probe."""
    from nearsight.index.ann import filter_plan

    probes: list[tuple[int, int]] = []  # (queries, nearest looked at) of each probe
    local_share = filter_plan.local_share

    def spy(index, queries, allowed, probe):
        probes.append((len(queries), probe))
        return local_share(index, queries, allowed, probe)

    # exact 1 ms; a walk 0.05 ms + 2 us per efSearch at alpha 2 (past ef 475 it costs more
    # than exact; walk_per_ef)
    costs = Costs(1.0, 0.0, 0.05, walk_per_ef(galleries["hnsw"]), plan=0.2, gate=0.01)
    cap = data["filters"]["cap"]
    with Gallery.open(galleries["hnsw"]) as gallery:
        hit = local_share(gallery._index, data["queries"], cap, filter_plan.GATE_PROBE) > 0
        assert hit.sum() >= 25 and (~hit).sum() >= 20
        queries = np.concatenate([data["queries"][hit], data["queries"][~hit][:20]])
        truth = brute_force(queries, data["vectors"], cap)
        monkeypatch.setattr(filter_plan, "local_share", spy)
        gallery._filters.costs = costs
        for _ in range(2):
            info: dict = {}
            _, ids = gallery.search(queries, K, ids=cap, info=info)
            assert recall(ids, truth) >= 0.95 and info["index"] > len(queries) // 2
        probe = max(int(gallery.meta["ef_search"]), filter_plan.LOCAL_PROBE)
    gate = (len(queries), filter_plan.GATE_PROBE)
    assert probes[:3] == [gate, (len(queries), probe), gate]
    assert probes[3:] == [(int(hit.sum()), probe)]  # the hits only


def test_costs_stored_before_the_plan_was_timed_are_measured_again():
    record = Costs(0.0, 1e-4, 0.0, 0.02, plan=0.4, gate=0.1).as_meta()
    assert Costs.from_meta(record) == Costs(0.0, 1e-4, 0.0, 0.02, plan=0.4, gate=0.1)
    for timed_later in ("plan_ms", "gate_ms"):
        assert Costs.from_meta({k: v for k, v in record.items() if k != timed_later}) is None


def test_the_costs_are_stored_at_build_time_and_measured_again_elsewhere(galleries, data):
    with Gallery.open(galleries["hnsw"]) as gallery:
        route = gallery.meta["filter_route"]
        assert route["alpha"] > 0 and route["tuned_recall"] >= route["target"] == TARGET_RECALL
        assert route["costs"]["exact_ms_per_item"] > 0 and route["costs"]["walk_ms_per_unit"] > 0
        assert gallery._filters.costs is not None  # this machine's: no calibration on open
    moved = {**gallery.meta["filter_route"]["costs"], "host": "another-machine"}
    assert Costs.from_meta(moved) is None  # measured again there (Gallery._calibrate_filters)


def test_a_search_that_cannot_promise_the_target_says_so(tmp_path, data):
    """A PQ gallery of codes only (no exact vectors to search or re-rank by): its filtered
    answers carry a note, through Gallery.search and through the Python API's results."""
    # a fifth of the catalog: codes only whatever the size, and still past MIN_PLAN_ITEMS
    # (smaller galleries search every filter exactly), so the filtered route is the same one
    count = COUNT // 5
    assert count >= 4 * filter_plan.MIN_PLAN_ITEMS
    items = [{"path": f"/s/{i}.jpg", "label": i % 3} for i in range(count)]
    folder = write_gallery(tmp_path / "g", data["vectors"][:count], items, model_sha256="e" * 64,
                           index_type="ivfpq", embeddings="drop")  # fmt: skip
    cap = data["filters"]["cap"]
    with Gallery.open(folder) as gallery:
        assert not gallery.vectors_exact
        info: dict = {}
        gallery.search(data["queries"][:3], K, ids=cap[cap < count], info=info)
        assert info["notes"] == [filtered.CODES_ONLY_NOTE]
        assert info["index"] == 3 and info["exact"] == 0  # every query ranked by the codes
        gallery.search(data["queries"][:3], K, info=info)  # unfiltered: nothing to say here
    with open_gallery(folder) as searcher:
        found = searcher.search_vector(data["queries"][0], K, filters="label=1")
        plain = searcher.search_vector(data["queries"][0], K)
    assert len(found) == K and found.notes == [filtered.CODES_ONLY_NOTE]
    assert plain.notes == []


def test_the_tuning_truth_in_blocks_is_the_stable_sort_of_every_score(monkeypatch):
    """filter_tuning.exact_top scans BLOCK items at a time (bounded memory at 10M items) and
    still gives what a stable argsort of all the scores gives: the same ids, ties by the lower
    id (values on a coarse grid make many ties, some across blocks)."""
    from nearsight.index.ann import filter_tuning

    monkeypatch.setattr(filter_tuning, "BLOCK", 700)
    rng = np.random.default_rng(3)
    vectors = np.round(rng.standard_normal((5000, 8)), 1).astype(np.float32)
    queries = np.round(rng.standard_normal((40, 8))).astype(np.float32)
    for allowed in (np.sort(rng.choice(5000, 2600, replace=False)), np.arange(6)):
        scores = queries @ vectors[allowed].T
        want = allowed[np.argsort(-scores, axis=1, kind="stable")[:, :10]]
        got = filter_tuning.exact_top(queries, lambda ids: vectors[ids], allowed, 10)
        assert np.array_equal(got, want)


def test_the_tuning_counts_a_group_of_clusters_on_the_queries_outside_it(data):
    """filter_tuning.tuning_filters: random and cap filters count every query; each group of
    clusters (two grains) counts only the queries none of whose nearest items is in it, the
    filter away from the query that the rule must be tuned for."""
    from nearsight.index.ann import filter_tuning

    vectors, queries = data["vectors"], data["queries"]
    inside = np.ones(len(vectors), bool)
    tests = filter_tuning.tuning_filters(vectors, inside, np.arange(len(vectors)), queries, 0)
    groups = [(allowed, counted) for allowed, counted in tests if not counted.all()]
    # (random, cap, two grains of groups) x 3 shares; a group holding no query counts them all
    assert len(tests) == 4 * len(filter_tuning.FILTER_SHARES) and len(groups) >= 3
    nearest = np.argmax(queries @ vectors.T, axis=1)  # each query's nearest item
    for allowed, counted in groups:
        assert counted.any() and not np.isin(nearest[counted], allowed).any()


@pytest.mark.parametrize("index_type", ["ivfpq", "hnsw"])
def test_the_tuning_walks_a_group_only_for_the_queries_outside_it(
    galleries, data, monkeypatch, index_type
):
    """tune_filters counts, for a group of clusters, only the queries tuning_filters marks as
    outside it: the queries it walks are exactly those whose plan walks and that count. The
    old tuning counted every query that walked, those inside the group too (an easy case:
    the query's own neighbours are allowed), and so tuned a narrower rule; here some query
    inside a group would walk, so counting it would show."""
    import faiss

    from nearsight.index.ann import filter_tuning
    from nearsight.index.ann.tuning import TARGET_RECALL, tuning_sample

    vectors = data["vectors"]
    ids = np.arange(len(vectors), dtype=np.int64)
    # the gallery build's index before its held-out sample went in, tuned (make_index, then
    # tune to tuning.TARGET_RECALL with re-ranking): the same index this test once built
    blob, meta, held_out = galleries["tuned"][index_type]
    assert TARGET_RECALL == 0.95 and meta["index_type"] == index_type
    assert np.array_equal(held_out, tuning_sample(len(ids), index_type))
    index = faiss.deserialize_index(blob)
    counted_by: dict[bytes, np.ndarray] = {}
    calls: list[tuple[str, bytes, np.ndarray]] = []  # ("plan" | "walk", allowed, queries)
    tuning_filters, plan_walk, walk_index = (
        filter_tuning.tuning_filters, filtered.plan_walk, filtered.walk_index
    )  # fmt: skip

    def spy_filters(*args, **kwargs):
        out = tuning_filters(*args, **kwargs)
        counted_by.update((allowed.tobytes(), counted) for allowed, counted in out)
        return out

    def spy_plan(*args, **kwargs):
        plan, work = plan_walk(*args, **kwargs)
        calls.append(("plan", args[5].tobytes(), work > 0))
        return plan, work

    def spy_walk(*args, **kwargs):
        calls.append(("walk", args[4].tobytes(), np.array(args[7], copy=True)))
        return walk_index(*args, **kwargs)

    monkeypatch.setattr(filter_tuning, "tuning_filters", spy_filters)
    monkeypatch.setattr(filtered, "plan_walk", spy_plan)
    monkeypatch.setattr(filtered, "walk_index", spy_walk)
    filter_tuning.tune_filters(index, index_type, meta, vectors, ids, held_out, 0.95)
    groups = {key for key, counted in counted_by.items() if not counted.all()}
    assert len(groups) >= 2
    inside_would_walk = 0
    for at, (kind, key, plans) in enumerate(calls):
        if kind != "plan":
            continue
        counts = plans & counted_by[key]  # the plan walks it and it counts
        after = calls[at + 1] if at + 1 < len(calls) else ("plan", b"", plans[:0])
        if counts.any():
            assert after[0] == "walk" and after[1] == key and np.array_equal(after[2], counts)
        else:
            # nothing walked for a filter no counted query walks (a walk of another filter
            # may follow: a PQ type's next refine, on the plans it made)
            assert after[0] == "plan" or after[1] != key
        inside_would_walk += int((plans & ~counted_by[key]).sum()) if key in groups else 0
    assert inside_would_walk > 0  # queries inside a group that the old tuning counted


def test_a_pq_walk_reranks_the_tuned_multiple_of_its_candidates(galleries, data, monkeypatch):
    """Forced through the index (no exact search), an IVF-PQ walk re-ranks ``refine`` x
    refine_candidates(k) of the codes' candidates by the exact vectors, ``refine`` as the build
    tuned it (filter_plan.REFINES; HNSW keeps no such rule). Re-ranking more keeps every true
    neighbour the fewer found (a superset of the same walk's candidates) and, on the cap away
    from the queries walked at alpha 8, finds more of them."""
    from nearsight.index.ann.filter_plan import REFINES

    monkeypatch.setattr(filtered, "FORCE", "index")
    cap, queries = data["filters"]["cap"], data["queries"]
    truth = brute_force(queries, data["vectors"], cap)
    with Gallery.open(galleries["hnsw"]) as gallery:
        assert "refine" not in gallery.meta["filter_route"]
    hits = {}
    with Gallery.open(galleries["ivfpq"]) as gallery:
        assert gallery.meta["filter_route"]["refine"] in REFINES
        for refine in REFINES:
            gallery.meta["filter_route"] = {**gallery.meta["filter_route"], "alpha": 8.0,
                                            "refine": refine}  # fmt: skip
            info: dict = {}
            _, ids = gallery.search(queries, K, ids=cap, info=info)
            assert info["index"] == len(queries) and np.isin(ids, cap).all()
            hits[refine] = np.array([len(set(a) & set(b)) for a, b in zip(ids, truth, strict=True)])
    fewer, more = hits[REFINES[0]], hits[REFINES[-1]]
    assert (more >= fewer).all() and more.sum() > fewer.sum()


def test_a_gallery_tuned_under_the_filter_target_says_so(galleries, data, monkeypatch):
    """The route promises filter_plan.TARGET_RECALL where it walks: a gallery whose rule was
    tuned to less (built for 0.95 before the target was raised) answers with a note naming
    the target and what its walks were tuned to; one tuned to the target has no note."""
    monkeypatch.setattr(filtered, "FORCE", "index")
    with Gallery.open(galleries["hnsw"]) as gallery:
        info: dict = {}
        gallery.search(data["queries"][:5], K, ids=data["filters"]["random"], info=info)
        assert info["notes"] == []
        gallery.meta["filter_route"] = {**gallery.meta["filter_route"], "target": 0.95,
                                        "tuned_recall": 0.9727}  # fmt: skip
        gallery.search(data["queries"][:5], K, ids=data["filters"]["random"], info=info)
    assert info["notes"] == [
        f"recall target {TARGET_RECALL:g} not promised: the gallery's filtered walks were "
        "tuned to recall@10 0.9727"
    ]
