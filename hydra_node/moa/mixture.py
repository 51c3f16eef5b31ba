"""The mixture of agents behind ``model: "mesh"`` (experimental): ask every member, arbitrate, reduce.

:class:`MixtureOfAgents` picks the members (``[moa] members``, or every distinct ready model in the
mesh, sorted by id, at most ``max_members`` and at most one per peer node: :func:`one_per_node`,
so that one node announcing many model ids takes one seat, not all; this node's own models each
count), runs the same chat on each of them at once — each a
normal routed request, local or remote, through the router and its scheduler — under one
per-member deadline (``deadline_s``), and hands the answers that came back to the pure arbiter
(:mod:`hydra_node.moa.arbiter`). A member that fails or misses the deadline is left out (its
generation cancelled where it runs); when every member is left out the request fails with 503
naming each one. As soon as more than half of *all* members gave equivalent answers, the others
cannot change the verdict: they are cancelled (status ``cancelled``) and the answer goes out. Without a majority, :meth:`MixtureOfAgents.reducer_request` builds the request for
the reducer model (``reducer``), which gets the candidates and writes one answer. The HTTP side
(whole answers and streams) is :mod:`hydra_node.moa.answers`; the rules are docs/moa.md.

Reasoning models (docs/reasoning.md): a request's reasoning fields go to each member that reasons,
fitted to it (:func:`fit_reasoning`: "no thinking" is the template's switch where it has one, a zero
budget where not), and are left out for a member that does not reason. The arbiter and the reducer
see answers only, never thoughts (a member's thoughts are not part of its ``content``); the
thoughts returned with the answer are those of the model that wrote it (the pick, or the reducer).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Callable, Collection, Mapping

import trio

from hydra_node.api.chat import ChatOutcome, complete_chat
from hydra_node.moa.arbiter import MemberAnswer, Verdict, answer_key, arbitrate
from hydra_node.moa.config import MESH_MODEL, MoaSettings
from hydra_node.api.errors import ApiError
from hydra_node.api.router_api import RouterApi
from hydra_node.inference import ChatMessage, GenerationError, GenerationRequest, ModelCaps
from hydra_node.routing.telemetry import LOCAL, Target

__all__ = [
    "MemberResult",
    "MoaRun",
    "MixtureOfAgents",
    "REDUCER_INSTRUCTION",
    "MAX_CANDIDATE_CHARS",
    "fit_reasoning",
    "one_per_node",
    "scheduler_quality",
]

log = logging.getLogger("hydra.api.moa")

#: Longest candidate answer shown to the reducer (a longer one is cut: the reducer's context is finite).
MAX_CANDIDATE_CHARS = 8000
#: What the reducer is asked, after the conversation, with the candidates (one per answer group).
REDUCER_INSTRUCTION = (
    "Several assistants answered the conversation above and they disagree. Their answers "
    "follow, each inside <candidate> tags. Using them, write the single best answer to the "
    "last message. Reply with that answer only; do not mention the candidates."
)


@dataclass(frozen=True)
class MemberResult:
    """What one member did: ``status`` is ``ok``, ``error`` (it failed), ``deadline`` (cut off) or
    ``cancelled`` (stopped early: more than half of all members had already agreed)."""

    model: str
    status: str
    latency_ms: float
    outcome: ChatOutcome | None = None
    error: str = ""
    error_status: int = 0
    served_by: str = ""
    quality: float = 1.0


@dataclass(frozen=True)
class MoaRun:
    """Every member's result and, when some answered, the arbiter's verdict."""

    members: tuple[MemberResult, ...]
    verdict: Verdict
    deadline_s: float

    def result(self, model: str) -> MemberResult:
        return next(m for m in self.members if m.model == model)

    @property
    def chosen(self) -> MemberResult:
        return self.result(self.verdict.chosen)

    @property
    def answered(self) -> tuple[MemberResult, ...]:
        return tuple(m for m in self.members if m.status == "ok")


def _answer(m: MemberResult) -> MemberAnswer:
    out = m.outcome
    assert out is not None
    return MemberAnswer(
        m.model,
        out.content or "",
        tuple((c.name, c.arguments) for c in out.tool_calls),
        quality=m.quality,
        latency_ms=m.latency_ms,
    )


def fit_reasoning(req: GenerationRequest, caps: ModelCaps) -> GenerationRequest:
    """``req``'s reasoning fields as a member that can do ``caps`` takes them: none for a model
    that does not reason; "no thinking" (``thinking`` False, or a zero budget) as that model's
    template can do it (its switch when it has one, else a zero budget)."""
    if not caps.reasons:
        return dataclasses.replace(req, thinking=None, thinking_budget=None, reasoning_effort="")
    if req.thinking is False or req.thinking_budget == 0:
        off = {"thinking": False, "thinking_budget": None} if caps.switch else {"thinking": None, "thinking_budget": 0}
        return dataclasses.replace(req, **off)
    return req


def scheduler_quality(scheduling, node_id: str) -> Callable[[str, str], float | None]:
    """``(model, served_by) -> success rate`` from the node's live scheduler (None: not measured)."""

    def quality(model: str, served_by: str) -> float | None:
        try:
            target = Target(LOCAL if served_by in ("", node_id) else served_by, model)
        except ValueError:
            return None
        return scheduling.telemetry.view(target, trio.current_time()).success_rate

    return quality


class MixtureOfAgents:
    """``model: "mesh"``: members, their answers under the deadline, the verdict, the reducer request."""

    def __init__(
        self,
        router: RouterApi,
        settings: MoaSettings,
        *,
        quality: Callable[[str, str], float | None] | None = None,
        own_node: str | None = None,
    ):
        """``own_node``: this node's id; its own models (the operator's choice) each take a seat,
        while every other node takes at most one (None: every node, this one included, one)."""
        self.router, self.settings, self.quality, self.own_node = router, settings, quality, own_node

    # ---- members ---------------------------------------------------------------------------
    def members(self) -> list[str]:
        """The models a mesh request asks now (ready somewhere in the mesh): ``[moa] members`` as
        listed, or else the ready models by id, no hosting node seating two (:func:`one_per_node`)."""
        ready = {
            m.id: [self._seat(node, m.id) for node, state in m.states.items() if state == "ready"]
            for m in self.router.models()
            if m.id != MESH_MODEL and "ready" in m.states.values()
        }
        if self.settings.members:
            return [m for m in self.settings.members if m in ready][: self.settings.max_members]
        return one_per_node(ready, self.settings.max_members)

    def _seat(self, node: str, model: str) -> str:
        """Where ``model`` on ``node`` sits: one seat per peer node; one per model on our own node."""
        return f"{node}\0{model}" if node == self.own_node else node

    def capabilities(self) -> ModelCaps:
        """What ``mesh`` can do, for the dialects' checks: it reasons when a member does (its
        format and default; the switch is assumed, as :func:`fit_reasoning` fits "no thinking"
        to each member)."""
        caps = [self.router.capabilities(m) for m in self.members()]
        reasoning = next((c.reasoning for c in caps if c.reasons), "")
        return ModelCaps(reasoning, thinks=any(c.thinks for c in caps), switch=bool(reasoning))

    def listed(self) -> bool:
        """``mesh`` appears in /v1/models: enabled, and at least two distinct members are ready."""
        return self.settings.enabled and len(self.members()) >= 2

    def check(self) -> list[str]:
        """The members of a request now, or a 400 that says why ``mesh`` cannot be asked."""
        if not self.settings.enabled:
            raise ApiError(
                400,
                f"model {MESH_MODEL!r} (mixture of agents) is disabled on this node ([moa] enabled = false)",
                "moa_disabled",
                "model",
            )
        members = self.members()
        if len(members) < 2:
            wanted = f" of [moa] members {list(self.settings.members)}" if self.settings.members else ""
            raise ApiError(
                400,
                f"model {MESH_MODEL!r} needs at least two distinct ready models{wanted} in the "
                f"mesh; ready now: {members or 'none'}",
                "moa_unavailable",
                "model",
            )
        return members

    # ---- asking ----------------------------------------------------------------------------
    async def ask(self, req: GenerationRequest, members: list[str]) -> MoaRun:
        """Every member at once, each cut off at the deadline; 503 (or the members' common 4xx)
        when none answered."""
        results: dict[str, MemberResult] = {}
        votes: dict[str, int] = {}  # answer key -> members that gave it so far
        start = trio.current_time()

        async def one(i: int, model: str, everyone: trio.CancelScope) -> None:
            member_req = self._fitted(dataclasses.replace(req, model=model, request_id=f"{req.request_id}-m{i}"))
            with trio.move_on_after(self.settings.deadline_s):
                try:
                    out = await complete_chat(self.router, member_req)
                except GenerationError as exc:
                    results[model] = MemberResult(
                        model, "error", _ms(start), error=exc.message, error_status=exc.status
                    )
                    log.info(
                        "event=moa_member_failed request=%s model=%s status=%s error=%r",
                        req.request_id,
                        model,
                        exc.status,
                        exc.message,
                    )
                    return
                q = self.quality(model, out.served_by) if self.quality is not None else None
                results[model] = MemberResult(
                    model, "ok", _ms(start), out, served_by=out.served_by, quality=1.0 if q is None else float(q)
                )
                key = answer_key(_answer(results[model]))
                votes[key] = votes.get(key, 0) + 1
                if 2 * votes[key] > len(members):  # a majority of all members: the rest cannot change it
                    everyone.cancel()
                return
            results[model] = MemberResult(
                model, "deadline", _ms(start), error=f"no answer within the deadline of {self.settings.deadline_s:g} s"
            )
            log.info("event=moa_member_deadline request=%s model=%s", req.request_id, model)

        async with trio.open_nursery() as nursery:
            for i, model in enumerate(members):
                nursery.start_soon(one, i, model, nursery.cancel_scope)
        for model in members:
            if model not in results:
                results[model] = MemberResult(
                    model, "cancelled", _ms(start), error="not needed: a majority of the members already agreed"
                )
        ordered = tuple(results[m] for m in members)
        answered = [m for m in ordered if m.status == "ok"]
        if not answered:
            raise _all_failed(ordered)
        return MoaRun(ordered, arbitrate(_answer(m) for m in answered), self.settings.deadline_s)

    def reducer_model(self, run: MoaRun) -> str:
        """The reducer to ask for ``run``: "" when there is a majority, one answer, or no reducer."""
        if run.verdict.majority or len(run.verdict.groups) < 2:
            return ""
        return self.settings.reducer

    def reducer_request(self, req: GenerationRequest, run: MoaRun, model: str) -> GenerationRequest:
        """``req`` for ``model`` with one more user message: the instruction and one candidate per
        answer group, in the arbiter's order."""
        parts = [REDUCER_INSTRUCTION]
        for i, group in enumerate(run.verdict.groups, 1):
            text = _candidate_text(run.result(group.members[0]).outcome)
            if len(text) > MAX_CANDIDATE_CHARS:
                text = text[:MAX_CANDIDATE_CHARS] + " [...]"
            parts.append(f"<candidate {i}>\n{text}\n</candidate>")
        return self._fitted(
            dataclasses.replace(
                req,
                model=model,
                request_id=f"{req.request_id}-reducer",
                messages=req.messages + (ChatMessage("user", "\n\n".join(parts)),),
            )
        )

    def _fitted(self, req: GenerationRequest) -> GenerationRequest:
        """``req`` (for one member or the reducer) with its reasoning fields fitted to its model."""
        if req.thinking is None and req.thinking_budget is None and not req.reasoning_effort:
            return req  # nothing to fit (and no need to ask what the model can do)
        return fit_reasoning(req, self.router.capabilities(req.model))


def one_per_node(hosts: Mapping[str, Collection[str]], limit: int) -> list[str]:
    """Up to ``limit`` model ids (sorted), each seated on a node that hosts it, no node seating two:
    a node's many (sybil) model ids take one seat, while a model a seated node shares with others
    still gets in. Earliest ids first; a later id moves an earlier one to another of its hosts
    when it can (augmenting paths, bounded by ``limit`` seats)."""
    seat: dict[str, str] = {}  # node -> the model seated on it

    def place(model: str, seen: set[str]) -> bool:
        for node in sorted(hosts[model]):
            if node in seen:
                continue
            seen.add(node)
            if node not in seat or place(seat[node], seen):
                seat[node] = model
                return True
        return False

    chosen: list[str] = []
    for model in sorted(hosts):
        if len(chosen) >= limit:
            break
        if place(model, set()):
            chosen.append(model)
    return chosen


def _candidate_text(out: ChatOutcome | None) -> str:
    if out is None:
        return ""
    calls = "\n".join(f"call {c.name}({c.arguments})" for c in out.tool_calls)
    return "\n".join(t for t in (out.content or "", calls) if t)


def _ms(start: float) -> float:
    return round((trio.current_time() - start) * 1000.0, 1)


def _all_failed(members: tuple[MemberResult, ...]) -> ApiError:
    why = "; ".join(f"{m.model}: {m.error}" for m in members)
    if all(m.status == "error" and m.error_status == 400 for m in members):
        # every member refused the request itself (too long a prompt, say): the client's to fix
        return ApiError(400, f"every member refused the request: {why}", "moa_members_refused")
    return ApiError(503, f"no member of {MESH_MODEL!r} answered: {why}", "moa_no_answer", retry_after=2.0)
