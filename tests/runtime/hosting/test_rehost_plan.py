"""The re-host election (hydra_node/runtime/hosting/rehost_plan.py) and its wire keys
(rehost_wire.py): pure, so every case is a view in, decisions out."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.runtime.hosting.rehost_plan import (
    Action,
    MemberView,
    RehostPlanner,
    decide,
    merge_wanted,
    own_wishes,
    rank_candidates,
)
from hydra_node.runtime.hosting.rehost_wire import (
    REHOST_EXTRA_ITEMS,
    ModelFile,
    PeerRehost,
    Spare,
    Wanted,
    parse_rehost_extra,
    rehost_extra,
)

GB = 1 << 30
BUNDLED = "bundled"
SHA = "ab" * 32
M = "m1"
ROOMY = Spare(8 * GB, 2)


def node(i: int) -> str:
    return f"{i:02d}" * 32


def member(
    i: int,
    *,
    spare: Spare | None = ROOMY,
    standby: bool = False,
    hosting: frozenset[str] = frozenset(),
    held: frozenset[str] = frozenset(),
    claims: frozenset[str] = frozenset(),
    failed: dict[str, float] | None = None,
    keep: tuple[Wanted, ...] = (),
    role: str = "host",
    alive: bool = True,
) -> MemberView:
    return MemberView(
        node(i),
        role=role,
        alive=alive,
        hosting=hosting,
        held=held,
        rehost=PeerRehost(spare=spare, standby=standby, keep=keep, claims=claims, failed=failed or {}),
    )


def elected(members, wanted, now=1000.0):
    """What every member decides: {node: action}; and the elected list (the same for all)."""
    lists = set()
    actions = {}
    for m in members:
        for d in decide(m.node_id, members, wanted, now, bundled_id=BUNDLED):
            if d.model == M:
                lists.add(d.elected)
                actions[m.node_id] = d.action
    return lists, actions


WANT = {M: Wanted(M, 1, sha256=SHA, size_bytes=1 * GB)}


def test_the_election_is_a_function_of_the_view_and_only_the_elected_claims():
    members = [member(i) for i in range(1, 5)]
    lists, actions = elected(members, WANT)
    assert len(lists) == 1
    (winners,) = lists
    assert len(winners) == 1
    assert [n for n, a in actions.items() if a is Action.CLAIM] == list(winners)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.booleans(), st.integers(0, 16), st.integers(0, 3)), min_size=1, max_size=6),
    st.integers(0, 3),
    st.randoms(use_true_random=False),
)
def test_property_every_node_elects_the_same_and_the_claims_fill_the_shortfall(spec, min_hosts, rnd):
    members = [
        member(i, standby=sb, held=frozenset({SHA}) if holds else frozenset(), spare=Spare(free * GB, slots))
        for i, (sb, holds, free, slots) in enumerate(spec, start=1)
    ]
    want = {M: Wanted(M, min_hosts, sha256=SHA, size_bytes=1 * GB)}
    shuffled = list(members)
    rnd.shuffle(shuffled)
    lists, actions = elected(members, want)
    lists2, _ = elected(shuffled, want)
    assert lists == lists2 and len(lists) <= 1  # the order of the view does not matter
    claims = [n for n, a in actions.items() if a is Action.CLAIM]
    eligible = [m for m in members if m.rehost.spare.models > 0 and m.rehost.spare.free_bytes >= GB]
    assert len(claims) == min(min_hosts, len(eligible))
    if claims:
        (winners,) = lists
        assert sorted(claims) == sorted(winners)
        if any(m.rehost.standby for m in eligible):  # a standby node goes first
            assert next(m for m in members if m.node_id == winners[0]).rehost.standby


def test_standby_first_then_the_holder_then_the_most_spare():
    plain_big = member(1, spare=Spare(64 * GB, 2))
    holder = member(2, held=frozenset({SHA}))
    standby = member(3, standby=True, spare=Spare(2 * GB, 1))
    want = WANT[M]
    assert rank_candidates(want, [plain_big, holder, standby], 0, bundled_id=BUNDLED) == [
        node(3),
        node(2),
        node(1),
    ]
    # by id: a node whose models_held names the model id holds it too; every node holds the bundled model
    by_id = member(4, held=frozenset({M}))
    assert rank_candidates(want, [plain_big, by_id], 0, bundled_id=BUNDLED)[0] == node(4)
    bundled = Wanted(BUNDLED, 1)
    assert rank_candidates(bundled, [member(5, spare=Spare(1 * GB, 1)), plain_big], 0, bundled_id=BUNDLED) == [
        node(1),
        node(5),
    ]


def test_back_off_moves_the_election_to_the_next_candidate():
    first, second = member(1, standby=True), member(2)
    lists, _ = elected([first, second], WANT)
    assert lists == {(node(1),)}
    failed = member(1, standby=True, failed={M: 1060.0})
    lists, actions = elected([failed, second], WANT, now=1000.0)
    assert lists == {(node(2),)} and actions[node(2)] is Action.CLAIM
    lists, _ = elected([failed, second], WANT, now=1061.0)  # the back-off is over
    assert lists == {(node(1),)}


def test_sizes_that_do_not_fit_roles_and_full_nodes_are_skipped():
    small = member(1, standby=True, spare=Spare(GB // 2, 2))
    full = member(2, spare=Spare(8 * GB, 0))
    worker = member(3, role="worker")
    client = member(4, role="client")
    silent = member(5, spare=None)  # no spare: re-hosting off, or an older node
    dead = member(6, alive=False)
    ok = member(7)
    view = [small, full, worker, client, silent, dead, ok]
    assert rank_candidates(WANT[M], view, 0, bundled_id=BUNDLED) == [node(7)]
    unknown = Wanted(M, 1)  # size unknown: any node with room for a model is eligible
    assert rank_candidates(unknown, view, 0, bundled_id=BUNDLED) == [node(1), node(7)]


def test_min_hosts_two_elects_two_and_zero_never():
    members = [member(i) for i in range(1, 5)]
    lists, actions = elected(members, {M: Wanted(M, 2, size_bytes=GB)})
    assert len(next(iter(lists))) == 2 and sum(a is Action.CLAIM for a in actions.values()) == 2
    host = member(9, hosting=frozenset({M}))
    lists, actions = elected([*members, host], {M: Wanted(M, 2, size_bytes=GB)})
    assert sum(a is Action.CLAIM for a in actions.values()) == 1  # one host is there already
    lists, actions = elected(members, {M: Wanted(M, 0)})
    assert not lists and not actions


def test_a_model_with_enough_hosts_or_claims_elects_nobody():
    members = [member(1, hosting=frozenset({M})), member(2)]
    assert decide(node(2), members, WANT, 0, bundled_id=BUNDLED) == []
    claimed = [member(1, claims=frozenset({M})), member(2)]
    assert decide(node(2), claimed, WANT, 0, bundled_id=BUNDLED) == []


def test_a_race_of_two_claims_resolves_to_one():
    view = [member(1, claims=frozenset({M})), member(2, claims=frozenset({M}), hosting=frozenset({M}))]
    actions = {
        m.node_id: next(d.action for d in decide(m.node_id, view, WANT, 0, bundled_id=BUNDLED) if d.model == M)
        for m in view
    }
    assert sorted(actions.values()) == [Action.NONE, Action.RELEASE]
    # a standby claimant keeps it over a plain one, whatever the hash says
    view = [member(1, claims=frozenset({M})), member(2, claims=frozenset({M}), standby=True)]
    d1 = next(d for d in decide(node(1), view, WANT, 0, bundled_id=BUNDLED) if d.model == M)
    d2 = next(d for d in decide(node(2), view, WANT, 0, bundled_id=BUNDLED) if d.model == M)
    assert (d1.action, d2.action) == (Action.RELEASE, Action.NONE)


def test_a_claim_is_released_when_the_permanent_host_comes_back():
    view = [member(1, hosting=frozenset({M})), member(2, claims=frozenset({M}), hosting=frozenset({M}))]
    (d,) = decide(node(2), view, WANT, 0, bundled_id=BUNDLED)
    assert d.action is Action.RELEASE
    # the claim stays while it is needed
    (d,) = decide(node(2), view[1:], WANT, 0, bundled_id=BUNDLED)
    assert d.action is Action.NONE


def test_the_settle_delay_holds_the_claim_back():
    view = [member(1, standby=True), member(2)]
    planner = RehostPlanner(node(1), settle_s=3.0, bundled_id=BUNDLED)
    (d,) = planner.step(view, WANT, now=10.0, now_unix=0)
    assert d.action is Action.SETTLING and d.rank == 0
    (d,) = planner.step(view, WANT, now=12.9, now_unix=0)
    assert d.action is Action.SETTLING
    (d,) = planner.step(view, WANT, now=13.0, now_unix=0)
    assert d.action is Action.CLAIM
    # a host shows up: the shortfall (and its clock) is gone; a new one settles again
    assert planner.step([*view, member(3, hosting=frozenset({M}))], WANT, now=14.0, now_unix=0) == []
    (d,) = planner.step(view, WANT, now=15.0, now_unix=0)
    assert d.action is Action.SETTLING


def test_refused_models_are_never_claimed_and_wanted_merges_by_max():
    view = [member(1, keep=(Wanted(M, 1, sha256=SHA),)), member(2, keep=(Wanted(M, 2, size_bytes=GB),))]
    wanted = merge_wanted(view, {})
    assert wanted[M] == Wanted(M, 2, "", SHA, GB)
    dead = member(3, alive=False, keep=(Wanted(M, 5),))
    assert merge_wanted([*view, dead], {})[M].min_hosts == 2
    (d,) = decide(node(1), view, wanted, 0, bundled_id=BUNDLED, refuse=frozenset({M}))
    assert d.action is Action.NONE and node(1) in d.elected


# ---- the wire keys -------------------------------------------------------------------------
def test_the_extra_keys_round_trip():
    extra = rehost_extra(
        spare=Spare(5 * GB, 2),
        standby=True,
        keep=[Wanted(M, 1, "0123456789abcdef", SHA, GB)],
        files=[ModelFile(M, SHA, GB)],
        claims=[M],
        failed={"m2": 1234.0},
    )
    got = parse_rehost_extra(extra)
    assert got == PeerRehost(
        Spare(5 * GB, 2),
        True,
        (Wanted(M, 1, "0123456789abcdef", SHA, GB),),
        (ModelFile(M, SHA, GB),),
        frozenset({M}),
        {"m2": 1234.0},
        0,
    )
    assert rehost_extra(spare=None, standby=False, keep=[], files=[], claims=[], failed={}) == {}


def test_malformed_values_are_dropped_and_counted_never_raised():
    got = parse_rehost_extra(
        {
            "spare": {"free_bytes": -1, "models": 2},
            "standby": "yes",
            "keep_hosted": [[M, 1, "", "", 0], [M, "x", "", "", 0], "junk", [M, 1, "BAD", "", 0]],
            "model_files": {"not": "a list"},
            "rehosting": [M, 5, ""],
            "rehost_failed": [[M, 10], [M]],
        }
    )
    assert got.spare is None and not got.standby
    assert got.keep == (Wanted(M, 1),) and got.files == () and got.claims == {M} and got.failed == {M: 10.0}
    assert got.malformed == 1 + 1 + 3 + 1 + 2 + 1


def test_keep_hosted_is_cut_to_the_items_budget():
    keep = [Wanted(f"m{i}", 1, "", SHA, GB) for i in range(16)]
    extra = rehost_extra(spare=Spare(GB, 2), standby=True, keep=keep, files=[], claims=[], failed={})

    def items(v):
        if isinstance(v, dict):
            return 1 + sum(items(x) for x in v.values())
        if isinstance(v, list):
            return 1 + sum(items(x) for x in v)
        return 1

    assert sum(items(v) for v in extra.values()) <= REHOST_EXTRA_ITEMS
    assert [e[0] for e in extra["keep_hosted"]] == [f"m{i}" for i in range(len(extra["keep_hosted"]))]
    assert len(extra["keep_hosted"]) >= 8


def test_own_wishes_config_first_then_recent_use_within_the_window():
    recent = {"old": 100.0, "new": 990.0, "mid": 900.0, "off": 995.0}
    wishes = own_wishes({"cfg": 2, "off": 0}, recent, now_unix=1000.0, keep_recent_s=600, limit=16)
    assert list(wishes.items()) == [("cfg", (2, "min_hosts")), ("new", (1, "recent")), ("mid", (1, "recent"))]
    assert own_wishes({"cfg": 2}, recent, now_unix=1000.0, keep_recent_s=0, limit=16) == {"cfg": (2, "min_hosts")}
    assert list(own_wishes({}, recent, now_unix=1000.0, keep_recent_s=600, limit=1)) == ["off"]
