"""Pure pieces of the single node: config, text assembly, runner framing, request parsing, identity."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import given, strategies as st

from hydra_node.api.errors import ApiError
from hydra_node.openai.parse import parse_request
from hydra_node.config import ConfigError, NodeConfig, parse_config_text
from hydra_node.mesh.identity import IdentityError, load_or_create_identity
from hydra_node.runtime.child.channel import MAX_CHANNEL_FRAME_BYTES, ChannelError, FrameDecoder, encode_frame
from hydra_node.runtime.child.textstream import TextAssembler


# ---- config ---------------------------------------------------------------------------


def test_seed_readme_config_parses():
    cfg = parse_config_text("""
[scheduler]
mode = "shadow"
ttft_budget_ms = 450
tpot_budget_ms = 40
affinity_override_threshold_ms = 100
stale_after_ms = 15000
cache_affinity_credit_ms = 80
failure_penalty_ms = 500
unknown_remote_penalty_ms = 75

[defaults.model_fit]
ctx_size = 8192
batch = 1024
ubatch = 256
flash_attention = "auto"
kv_cache_policy = "balanced"

[defaults.model_fit.prefix_cache]
enabled = true
max_entries = 64

[defaults.hardware]
model_runtime = "auto"
gpu_layers = "auto"
mlock = false
safety_margin_gb = 2.0

[defaults.throughput]
parallel = 1
threads = 8
threads_batch = 4
tuning_profile = "balanced"
""")
    assert cfg.scheduler.mode == "shadow" and cfg.defaults.model_fit.ctx_size == 8192
    assert cfg.defaults.hardware.safety_margin_gb == 2.0 and cfg.defaults.throughput.threads == 8


@pytest.mark.parametrize(
    "text,key",
    [
        ("[scheduler]\nmode = 'fast'\n", "[scheduler].mode"),
        ("[scheduler]\nttft_budget = 3\n", "[scheduler].ttft_budget"),
        ("[schedular]\n", "[schedular]"),
        ("[defaults.model_fit]\nctx_size = 'big'\n", "[defaults.model_fit].ctx_size"),
        ("[defaults.model_fit]\nctx_size = 12\n", "[defaults.model_fit].ctx_size"),
        ("[defaults.throughput]\nparallel = 65\n", "[defaults.throughput].parallel"),
        ("[defaults.throughput]\nparallel = 0\n", "[defaults.throughput].parallel"),
        ("[defaults.throughput]\nparallel = 2\ncontinuous_batching = false\n", "[defaults.throughput].parallel"),
        ("[defaults.hardware]\nmlock = 1\n", "[defaults.hardware].mlock"),
        ("[defaults.model_fit.prefix_cache]\nnope = 1\n", "[defaults.model_fit.prefix_cache].nope"),
        ("[runner]\nload_timeout_s = -1\n", "[runner].load_timeout_s"),
        ("this is not toml", "not valid TOML"),
    ],
)
def test_bad_config_names_the_key(text, key):
    with pytest.raises(ConfigError) as e:
        parse_config_text(text)
    assert key in str(e.value)


def test_listen_all_without_key_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="API key"):
        NodeConfig(home=tmp_path, listen_all=True).validate()
    NodeConfig(home=tmp_path, listen_all=True, api_key="long-enough-key").validate()


# ---- text assembly ----------------------------------------------------------------------


def test_utf8_split_across_tokens_is_never_emitted_half():
    a = TextAssembler()
    euro = "€".encode()
    assert a.feed(euro[:1]) == "" and a.feed(euro[1:2]) == ""
    assert a.feed(euro[2:]) == "€"


def test_stop_sequence_spanning_tokens_is_cut_and_never_leaked():
    a = TextAssembler(("END",))
    out = a.feed(b"hello E") + a.feed(b"N")
    assert "E" not in out
    out += a.feed(b"D and more")
    assert out == "hello " and a.stopped and a.flush() == ""


def test_held_back_prefix_is_released_when_not_a_stop():
    a = TextAssembler(("END",))
    assert a.feed(b"x EN") == "x "
    assert a.feed(b"Z") == "ENZ"


@given(st.text(max_size=60), st.lists(st.integers(1, 6), max_size=30), st.sampled_from(["", "ab", "\n\n", "é!"]))
def test_assembler_output_is_prefix_before_first_stop(text, cuts, stop):
    data = text.encode()
    a = TextAssembler((stop,) if stop else ())
    out, i = "", 0
    for c in cuts + [len(data)]:
        out += a.feed(data[i : i + c])
        i += c
    out += a.feed(data[i:]) + a.flush()
    expected = text.split(stop)[0] if stop else text
    assert out == expected


# ---- runner channel ---------------------------------------------------------------------


@given(
    st.lists(
        st.dictionaries(
            st.text(max_size=5).filter(lambda k: k not in ("op", "id")),
            st.integers(-(2**64), 2**64 - 1) | st.text(max_size=10),
            max_size=4,
        ),
        max_size=5,
    ),
    st.integers(1, 17),
)
def test_frames_survive_any_chunking(msgs, chunk):
    msgs = [{"op": "x", **m} for m in msgs]
    data = b"".join(encode_frame(m) for m in msgs)
    d = FrameDecoder()
    got = []
    for i in range(0, len(data), chunk):
        d.receive_data(data[i : i + chunk])
        while (m := d.next_message()) is not None:
            got.append(m)
    assert got == msgs


@given(st.binary(max_size=200))
def test_garbage_frames_raise_channel_error_only(data):
    d = FrameDecoder()
    d.receive_data(data)
    try:
        while d.next_message() is not None:
            pass
    except ChannelError:
        pass


def test_oversized_frame_is_refused():
    d = FrameDecoder()
    d.receive_data((MAX_CHANNEL_FRAME_BYTES + 1).to_bytes(4, "big"))
    with pytest.raises(ChannelError):
        d.next_message()


# ---- request parsing --------------------------------------------------------------------


@given(st.binary(max_size=300))
def test_parse_request_never_crashes(raw):
    for kind in ("chat", "completion"):
        try:
            parse_request(raw, kind)
        except ApiError as e:
            assert e.status == 400


def test_parse_chat_accepts_text_parts_and_stream_options():
    req, stream, usage = parse_request(
        b'{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],'
        b'"stream":true,"stream_options":{"include_usage":true},"stop":"x","max_completion_tokens":5}',
        "chat",
    )
    assert (
        [(m.role, m.content) for m in req.messages] == [("user", "ab")]
        and stream
        and usage
        and req.stop == ("x",)
        and req.max_tokens == 5
    )


# ---- identity ---------------------------------------------------------------------------


def test_identity_is_created_0600_and_stable(tmp_path):
    a = load_or_create_identity(tmp_path)
    path = tmp_path / "identity" / "node.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_identity(tmp_path).node_id == a.node_id
    os.chmod(path, 0o644)
    with pytest.raises(IdentityError, match="chmod 600"):
        load_or_create_identity(tmp_path)
    os.chmod(path, 0o600)
    path.write_text("zz")
    with pytest.raises(IdentityError, match="corrupt"):
        load_or_create_identity(tmp_path)


def test_admission_limit_is_fifo_and_resizable():
    import trio
    import trio.testing

    from hydra_node.runtime.runner.admission import AdmissionLimit

    async def main():
        lim = AdmissionLimit(2)
        order: list[int] = []

        async def job(i: int, hold: trio.Event) -> None:
            await lim.acquire()
            order.append(i)
            await hold.wait()
            lim.release()

        holds = [trio.Event() for _ in range(5)]
        async with trio.open_nursery() as n:
            for i in range(5):
                n.start_soon(job, i, holds[i])
                await trio.testing.wait_all_tasks_blocked()
            assert order == [0, 1] and lim.used == 2  # two admitted, three waiting in order
            lim.resize(3)
            await trio.testing.wait_all_tasks_blocked()
            assert order == [0, 1, 2]
            lim.resize(1)  # shrinking cuts nobody short: 3 run until they finish
            holds[0].set()
            holds[1].set()
            await trio.testing.wait_all_tasks_blocked()
            assert order == [0, 1, 2] and lim.used == 1
            holds[2].set()
            await trio.testing.wait_all_tasks_blocked()
            assert order == [0, 1, 2, 3]
            holds[3].set()
            holds[4].set()
        assert order == [0, 1, 2, 3, 4] and lim.used == 0
        with pytest.raises(RuntimeError):
            lim.release()

    trio.run(main)


def test_admission_limit_waiter_cancelled_before_its_turn_takes_no_slot():
    import trio
    import trio.testing

    from hydra_node.runtime.runner.admission import AdmissionLimit

    async def main():
        lim = AdmissionLimit(1)
        await lim.acquire()
        with trio.move_on_after(1):
            await lim.acquire()
        assert lim.used == 1
        lim.release()
        assert lim.used == 0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
