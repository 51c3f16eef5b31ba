"""A real runner child renders tool prompts and token prompts (the bundled model; the engine, and the
one-sequence path a runner with a draft model takes).

The prompt a runner evaluates is checked by its size: the ``prompt_tokens`` it reports must be
the token count of the prompt rendered here with the model's own template (chat_prompt.py).
A token id outside the vocabulary is a 400 ``invalid_prompt``, and the runner keeps serving.
"""

from __future__ import annotations

import pytest
import trio

from hydra_node.inference import ChatMessage, Finished, GenerationError, GenerationRequest, ToolCall, ToolSpec
from hydra_node.models import resolve_model
from hydra_node.runtime.child.chat_prompt import ChatTemplate
from hydra_node.runtime.runner.records import RunnerSettings
from hydra_node.runtime.runner.supervisor import RunnerSupervisor
from hydra_node.runtime.speculative.runner_args import argv_for

TIMEOUT_S = 180
N_CTX = 2048
WEATHER = ToolSpec(
    "get_weather",
    "The current weather in a city",
    '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}',
)
FORCING = "You are a weather assistant. Always answer by calling get_weather; never answer in prose."


def chat(*messages, **kw) -> GenerationRequest:
    return GenerationRequest(model="m", kind="chat", messages=messages, max_tokens=6, temperature=0.0, **kw)


FORCED = chat(
    ChatMessage("system", FORCING),
    ChatMessage("user", "What is the weather in Paris?"),
    tools=(WEATHER,),
    tool_choice="required",
    parallel_tool_calls=False,
)
HISTORY = chat(
    ChatMessage("system", FORCING),
    ChatMessage("user", "Weather in Paris?"),
    ChatMessage("assistant", "", (ToolCall("c1", "get_weather", '{"city": "Paris"}'),)),
    ChatMessage("tool", "18 C and sunny", tool_call_id="c1", name="get_weather"),
    tools=(WEATHER,),
)


@pytest.fixture(scope="module")
def expected_tokens(model_path):
    """The token count of each prompt as the runner must render it."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    text = llm._model.token_get_text
    tpl = ChatTemplate(
        llm.metadata["tokenizer.chat_template"], bos_token=text(llm.token_bos()), eos_token=text(llm.token_eos())
    )

    def count(req: GenerationRequest) -> int:
        res = tpl.render(req.to_wire())
        return len(llm.tokenize(res.text.encode(), add_bos=not res.added_special, special=True))

    return {"forced": count(FORCED), "history": count(HISTORY), "n_vocab": llm.n_vocab()}


async def run(sup: RunnerSupervisor, req: GenerationRequest) -> list:
    async with sup.generate(req) as events:
        return [ev async for ev in events]


@pytest.mark.parametrize("draft", [False, True], ids=["engine", "draft"])
async def test_tool_prompts_and_token_prompts_through_a_real_runner(
    tmp_path, model_path, expected_tokens, draft
) -> None:
    # a draft model (here the model itself): the runner speculates inside the engine
    extra = tuple(argv_for(model=str(model_path))) if draft else ()
    settings = RunnerSettings(n_ctx=N_CTX, warmup=False, extra_argv=extra)
    sup = RunnerSupervisor(resolve_model(None), tmp_path, settings, node_id="n")
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            assert sup.info["engine"]["mode"] == "continuous_batching"
            for name, req in (("forced", FORCED), ("history", HISTORY)):
                fin = (await run(sup, req))[-1]
                assert isinstance(fin, Finished) and fin.completion_tokens >= 1
                assert fin.prompt_tokens == expected_tokens[name] < N_CTX

            ids = (1, 504, 2744, 28, 260, 3434)  # used as they are: no BOS added
            fin = (
                await run(
                    sup,
                    GenerationRequest(model="m", kind="completion", prompt_tokens=ids, max_tokens=2, temperature=0.0),
                )
            )[-1]
            assert isinstance(fin, Finished) and fin.prompt_tokens == len(ids)

            outside = GenerationRequest(
                model="m", kind="completion", max_tokens=2, prompt_tokens=(1, expected_tokens["n_vocab"])
            )
            with pytest.raises(GenerationError) as err:
                await run(sup, outside)
            assert err.value.code == "invalid_prompt" and err.value.status == 400
            assert "vocabulary" in err.value.message

            fin = (await run(sup, chat(ChatMessage("user", "hello"))))[-1]  # still serving
            assert isinstance(fin, Finished) and sup.restarts == 0
            nursery.cancel_scope.cancel()
