"""`serve` as a client meets it, over real HTTP: a tiny checkpoint of each task behind a server of its own (a separate
process on a free port of 127.0.0.1), concurrent requests whose answers equal what `generate`, `translate` and
`predict` give for the same input and options, the `openai` client on a language model's chat route (whole and
streamed), bad requests answered with a 4xx and a one-line reason while the server keeps serving, and SIGTERM ending
the server and every process it started within seconds.

One server per task, shared by that task's tests (a class each, so only one server runs at a time); every request
goes to loopback, bounded in count and in time."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _forked import HARNESS_ENV, warm_python
from test_cli import CONFIGS, ROOT, _cli

pytest.importorskip("litserve")

HOST = "127.0.0.1"
STOP_SECONDS = 30  # SIGTERM to exit: seconds on a quiet machine, more on a loaded 2-core one
START_SECONDS = 300
REQUEST_SECONDS = 120


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def _children(pid: int) -> set[int]:
    """Every process descended from `pid` now (from /proc), so the test can check that none outlives the server."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found.update(kids)
        todo.extend(kids)
    return found


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return status != "Z"


class Server:
    """`python -m lit_transformer serve --checkpoint CKPT ARGS` on a free loopback port, ready once /health is 200."""

    def __init__(self, checkpoint: Path, *args: str, log: Path) -> None:
        self.port = free_port()
        self.log = log
        command = [sys.executable, "-m", "lit_transformer", "serve", "--checkpoint", str(checkpoint)]
        command += ["--port", str(self.port), "--log_level", "warning", *args]
        self.output = log.open("w")
        # A session of its own: whatever happens to the test, the cleanup below reaches every process of the server.
        # Forked from a warm interpreter (tests/_forked.py): the server's own process without seconds of imports; the
        # inference workers LitServe starts are fresh interpreters, as always.
        self.process = warm_python(HARNESS_ENV).popen(command, cwd=ROOT, stdout=self.output, stderr=subprocess.STDOUT,
                                                      start_new_session=True)  # fmt: skip
        self.stopped_in: float | None = None
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"serve ended with {self.process.returncode}:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                status, _ = self.get("/health")
                if status == 200:
                    return
            time.sleep(0.5)
        self.kill()
        raise AssertionError(f"serve was not ready in {START_SECONDS} s:\n{log.read_text()[-3000:]}")

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def get(self, path: str) -> tuple[int, str]:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return response.status, response.read().decode()

    def post(self, body: object, path: str = "/predict", raw: bytes | None = None) -> tuple[int, dict]:
        data = raw if raw is not None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_SECONDS) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def post_all(self, bodies: list[dict]) -> list[tuple[int, dict]]:
        """The bodies sent at once, each from a client thread of its own; the answers in the bodies' order."""
        with ThreadPoolExecutor(len(bodies)) as pool:
            return list(pool.map(self.post, bodies))

    def stop(self) -> None:
        """SIGTERM to the server's process alone (as `docker stop` sends it), then every process it started is gone."""
        if self.stopped_in is not None:
            return
        children = _children(self.process.pid)
        start = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=STOP_SECONDS)
        finally:
            self.stopped_in = time.monotonic() - start
            self.output.close()
            self.kill()
        assert code == 0, self.log.read_text()[-3000:]
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in children if _alive(pid)], "processes outlived the server"

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


def _where(run: Path) -> list[str]:
    return [
        "--trainer.default_root_dir", str(run), "--trainer.logger", "false", "--checkpoint.dirpath",
        str(run / "checkpoints"), "--data.init_args.cache_dir", str(run / "cache"),
    ]  # fmt: skip


SHORT = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "2"]
SHORT += ["--trainer.num_sanity_val_steps", "0", "--checkpoint.every_n_train_steps", "2"]


def _fit(run: Path, *args: str) -> Path:
    _cli("fit", *args, *SHORT, *_where(run), cwd=ROOT)
    return run / "checkpoints" / "last.ckpt"


def _one_line(reason: str) -> bool:
    return isinstance(reason, str) and "\n" not in reason and 0 < len(reason) < 300


def _check_refusals(server: Server, cases: list[tuple[object, int, str]], path: str = "/predict") -> None:
    """Each body gets its status and a one-line reason that says `expect`; a good request is answered after them."""
    for body, status, expect in cases:
        raw = body if isinstance(body, bytes) else None
        code, answer = server.post(body, path, raw=raw)
        assert code == status, (body, code, answer)
        reason = answer["error"]["message"] if path.startswith("/v1/") else answer["detail"]  # OpenAI's shape there
        assert _one_line(reason) and expect in reason, (body, answer)


# ---- a language model: /predict against `generate`, the chat route through the openai client ----------------------


@pytest.mark.slow
class TestLanguageModel:
    @pytest.fixture(scope="class")
    def lm(self, tmp_path_factory):
        run = tmp_path_factory.mktemp("serve_lm")
        checkpoint = _fit(
            run, "--config", str(CONFIGS / "presets" / "tiny.yaml"), "--data.init_args.max_chars", "20000"
        )
        server = Server(checkpoint, "--max_batch_size", "4", "--batch_timeout", "0.2", log=run / "serve.log")
        yield checkpoint, server
        server.kill()

    def test_concurrent_answers_equal_generate(self, lm, tmp_path):
        checkpoint, server = lm
        bodies = [
            {"text": "ROMEO:", "max_new_tokens": 10, "temperature": 0},
            {"text": "JULIET:", "max_new_tokens": 6, "temperature": 0},
            {"text": "First Citizen:\nBefore", "max_new_tokens": 10, "temperature": 0},
            {"text": "KING:", "max_new_tokens": 8, "temperature": 1.0, "seed": 3},
            {"text": "QUEEN:", "max_new_tokens": 8, "temperature": 1.0, "seed": 3},  # the same options: decoded apart
            {"text": "KING:", "max_new_tokens": 8, "temperature": 1.0, "seed": 4, "top_k": 5},
            {"text": "ROMEO:", "max_new_tokens": 6, "temperature": 0, "repetition_penalty": 1.5},
            {"text": "", "max_new_tokens": 5, "temperature": 0, "stop": "e"},
        ]
        answers = server.post_all(bodies)
        for body, (status, answer) in zip(bodies, answers, strict=True):
            assert status == 200, answer
            flags = [f"--{k}={v}" for k, v in body.items() if k != "text"]
            printed = _cli("generate", "--checkpoint", str(checkpoint), "--prompt", body["text"], *flags, cwd=tmp_path)
            assert answer["input"] == body["text"]
            assert body["text"] + answer["output"] + "\n" == printed.stdout, body
            assert isinstance(answer["tokens"], list) and all(isinstance(t, int) for t in answer["tokens"])
        assert answers[0][1] != answers[1][1]

    def test_the_openai_client_talks_to_the_chat_route(self, lm):
        openai = pytest.importorskip("openai")
        _, server = lm
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=REQUEST_SECONDS)
        messages = [{"role": "user", "content": "ROMEO:"}]
        _, expected = server.post({"text": "ROMEO:", "max_new_tokens": 10, "temperature": 0})
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
        assert reply.choices[0].message.content == expected["output"]
        assert reply.usage.completion_tokens == len(expected["tokens"]) and reply.usage.prompt_tokens > 0
        stream = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=10, temperature=0, stream=True
        )
        pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
        assert "".join(pieces) == expected["output"] and len([p for p in pieces if p]) > 1  # token by token
        # A seed makes a sample repeatable, as on /predict; options OpenAI's API lacks go in extra_body.
        _, sampled = server.post({"text": "KING:", "max_new_tokens": 8, "temperature": 1.0, "seed": 3, "top_k": 5})
        chat = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "KING:"}], max_tokens=8, temperature=1.0, seed=3,
            extra_body={"top_k": 5},
        )  # fmt: skip
        assert chat.choices[0].message.content == sampled["output"]
        with pytest.raises(openai.BadRequestError, match="presence_penalty"):
            client.chat.completions.create(model="tiny", messages=messages, presence_penalty=1.0)

    def test_the_chat_route_follows_openais_rules_for_refusals_choices_and_endings(self, lm):
        """A refused streaming request was a 200 whose one event held the error (the openai client read an empty
        reply); n=0 a 500 and n=3 with a seed three equal texts; finish_reason was "stop" when max_tokens cut the
        text; each streamed chunk had an id of its own."""
        openai = pytest.importorskip("openai")
        _, server = lm
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=REQUEST_SECONDS)
        messages = [{"role": "user", "content": "ROMEO:"}]
        for stream in (False, True):
            with pytest.raises(openai.UnprocessableEntityError, match="temperature=-1.0 must be >= 0"):
                client.chat.completions.create(model="t", messages=messages, temperature=-1, stream=stream)
            with pytest.raises(openai.BadRequestError, match="messages is empty"):
                client.chat.completions.create(model="t", messages=[], stream=stream)
        with pytest.raises(openai.UnprocessableEntityError, match="n=0: ask for 1 to 16 choices"):
            client.chat.completions.create(model="t", messages=messages, n=0)
        with pytest.raises(openai.UnprocessableEntityError, match="n=3 with a seed: every choice would be the same"):
            client.chat.completions.create(model="t", messages=messages, n=3, seed=3)
        reply = client.chat.completions.create(model="t", messages=messages, max_tokens=4, n=2)
        assert len(reply.choices) == 2 and {c.finish_reason for c in reply.choices} <= {"stop", "length"}
        one = client.chat.completions.create(model="t", messages=messages, max_tokens=4).usage
        for usage in (reply.usage, _streamed_usage(client, messages, n=2)):  # the prompt once (it counted n times)
            assert usage.prompt_tokens == one.prompt_tokens and usage.completion_tokens >= one.completion_tokens
            assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        _, greedy = server.post({"text": "ROMEO:", "max_new_tokens": 4, "temperature": 0})
        ending = "length" if len(greedy["tokens"]) == 4 else "stop"
        reply = client.chat.completions.create(model="t", messages=messages, max_tokens=4, temperature=0)
        assert reply.choices[0].finish_reason == ending
        chunks = list(client.chat.completions.create(model="t", messages=messages, max_tokens=4, temperature=0,
                                                     stream=True))  # fmt: skip
        assert len({chunk.id for chunk in chunks}) == 1 and chunks[-1].choices[0].finish_reason == ending
        _, longer = server.post({"text": "ROMEO:", "max_new_tokens": 12, "temperature": 0})
        stop = longer["output"].strip()[-1]  # a character the greedy text reaches
        stopped = client.chat.completions.create(
            model="t", messages=messages, max_tokens=12, temperature=0, stop=[stop]
        )
        assert stopped.choices[0].finish_reason == "stop"

    def test_bad_requests_get_a_4xx_and_one_line_and_the_server_keeps_serving(self, lm):
        _, server = lm
        long_prompt = "To be, or not to be, that is the question. " * 40
        cases = [
            ({"max_new_tokens": 4}, 422, "text: Field required"),
            # OpenAI's completions name: the unknown field and the missing one are one mistake (was "text: Field
            # required (and 1 more)")
            (
                {"prompt": "a"},
                422,
                "prompt is not a field of this request, and text is required: send text in its place",
            ),
            ({"text": 7}, 422, "text: Input should be a valid string"),
            ({"text": "a", "max_new_tokens": "4"}, 422, "max_new_tokens: Input should be a valid integer"),
            ({"text": "a", "temprature": 0}, 422, "did you mean temperature?"),
            ({"text": "a", "temperature": -1}, 422, "temperature=-1.0 must be >= 0"),
            ({"text": "a", "max_new_tokens": 100000}, 422, "limit of 1024"),
            ({"text": "a", "stop_token_ids": [-1]}, 422, "must be token ids (0 or more)"),
            ({"text": "a", "eos_token_id": 100000}, 422, "[100000] are not tokens of this model (ids 0 to "),
            ({"text": long_prompt}, 400, "more than the model's context of 64"),
            (b"{not json", 422, "not valid JSON"),
            (["a", "list"], 422, "must be a JSON object"),
        ]
        _check_refusals(server, cases)
        good = {"text": "ROMEO:", "max_new_tokens": 3, "temperature": 0}
        bad = {"text": long_prompt, "max_new_tokens": 3}
        answers = server.post_all([good, bad, good, {"text": "ROMEO:", "num_beams": 99}])  # batched with good ones
        assert [status for status, _ in answers] == [200, 400, 200, 422]
        assert answers[0][1] == answers[2][1]
        chat = {"messages": [{"role": "user", "content": long_prompt}], "max_tokens": 3}
        _check_refusals(server, [(chat, 400, "more than the model's context")], path="/v1/chat/completions")
        assert server.get("/health") == (200, "ok")
        info = json.loads(server.get("/info")[1])["model"]
        assert info["task"] == "LanguageModeling" and "POST /v1/chat/completions" in info["routes"]

    def test_int8_and_compiled_decoding_are_the_commands_own(self, lm, tmp_path):
        """The handler a worker runs, in this process: --quantize int8 answers what `generate --quantize int8`
        prints; --compile reaches every request's GenerationConfig (compiled decoding itself: test_compiled_decoding)."""
        from lit_transformer.serving.handlers import ModelOptions, TextGeneration, load_for_serving
        from lit_transformer.serving.requests import TextRequest

        checkpoint, _ = lm
        options = ModelOptions(str(checkpoint), quantize="int8")
        handler = TextGeneration(load_for_serving(options), options)
        request = TextRequest(text="ROMEO:", max_new_tokens=8, temperature=0.0)
        (row,) = handler.answer([handler.prepare(request)])
        flags = ["--prompt", "ROMEO:", "--max_new_tokens", "8", "--temperature", "0", "--quantize", "int8"]
        assert (
            "ROMEO:" + row["output"] + "\n"
            == _cli("generate", "--checkpoint", str(checkpoint), *flags, cwd=tmp_path).stdout
        )
        compiled = TextGeneration(handler.loaded, ModelOptions(str(checkpoint), compile=True))
        assert compiled.prepare(request).gen.compile and not handler.prepare(request).gen.compile

    def test_a_worker_imports_no_lightning_nor_torchmetrics(self, lm):
        """What a worker does (a fresh interpreter, as LitServe spawns it): import the APIs, load the checkpoint and
        answer a request. Serving does not train, so Lightning and torchmetrics stay out (the tasks imported them at
        the top of captioning.py and translation.py: about 5 s of CPU per worker and per server start)."""
        checkpoint, _ = lm
        code = (
            "import sys\nfrom lit_transformer.serving.apis import PredictAPI\n"
            "from lit_transformer.serving.handlers import ModelOptions, build_handler\n"
            "from lit_transformer.serving.requests import TextRequest\n"
            f"handler = build_handler(ModelOptions({str(checkpoint)!r}), 'cpu')\n"
            "print(handler.answer([handler.prepare(TextRequest(text='ROMEO:', max_new_tokens=2))])[0]['input'])\n"
            "print('LOADED', sorted(m for m in ('lightning', 'pytorch_lightning', 'torchmetrics') if m in sys.modules))"
        )
        result = subprocess.run([sys.executable, "-c", code], env=HARNESS_ENV, capture_output=True, text=True,
                                timeout=REQUEST_SECONDS, check=False)  # fmt: skip
        assert result.stdout.splitlines()[-2:] == ["ROMEO:", "LOADED []"], result.stdout + result.stderr[-3000:]

    def test_a_request_that_breaks_a_batch_fails_alone(self, lm, monkeypatch):
        from lit_transformer.serving.handlers import ModelOptions, Refusal, TextGeneration, load_for_serving
        from lit_transformer.serving.requests import TextRequest

        checkpoint, _ = lm
        handler = TextGeneration(load_for_serving(ModelOptions(str(checkpoint))), ModelOptions(str(checkpoint)))
        run = handler.run

        def fragile(items):
            if any(item.text == "boom" for item in items):
                raise RuntimeError("a bug")
            return run(items)

        monkeypatch.setattr(handler, "run", fragile)
        prepared = [handler.prepare(TextRequest(text=t, max_new_tokens=3, temperature=0.0)) for t in ("a", "boom", "b")]
        answers = handler.answer(prepared)
        assert answers[1] == Refusal(500, "the model failed on this request (RuntimeError: a bug)")
        assert [a["input"] for a in (answers[0], answers[2])] == ["a", "b"]

    def test_the_serving_benchmark_writes_rates_and_latencies_with_its_machine(self, lm, tmp_path):
        """`bench serve` on the tiny checkpoint, a handful of requests: a server of its own, each level's rows."""
        from lit_transformer.bench.serve_load import main

        checkpoint, _ = lm
        out = tmp_path / "serving.json"
        args = ["--checkpoint", str(checkpoint), "--clients", "1", "3", "--requests_per_client", "2"]
        args += ["--batch_sizes", "3", "--max_new_tokens", "4", "--warmup", "1", "--json", str(out)]
        main(args)
        (run,) = json.loads(out.read_text())["runs"]
        assert run["machine"]["cpu"] and run["command"].startswith("python -m lit_transformer bench serve")
        rows = {row["section"]: row for row in run["rows"]}
        assert set(rows) == {"1 clients", "3 clients"} and rows["3 clients"]["requests"] == 6
        for row in rows.values():
            assert row["errors"] == 0 and row["contender"] == "batched (max_batch_size 3)"
            assert row["requests_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"]

    def test_sigterm_ends_the_server_and_its_processes(self, lm):
        _, server = lm
        server.stop()
        assert server.stopped_in < STOP_SECONDS


# ---- translation: /predict against `translate` ------------------------------------------------------------------


@pytest.mark.slow
class TestTranslation:
    @pytest.fixture(scope="class")
    def mt(self, tmp_path_factory):
        run = tmp_path_factory.mktemp("serve_mt")
        preset = ["--config", str(CONFIGS / "presets" / "tiny-translate.yaml"), "--data.init_args.max_pairs", "300"]
        checkpoint = _fit(run, *preset)
        server = Server(checkpoint, "--max_batch_size", "3", "--batch_timeout", "0.2", log=run / "serve.log")
        yield checkpoint, server
        server.kill()

    def test_concurrent_answers_equal_translate_and_bad_requests(self, mt, tmp_path):
        checkpoint, server = mt
        sources = ["In the beginning God created the heaven and the earth.", "And God said, Let there be light."]
        bodies = [{"text": sources[0], "max_new_tokens": 8}, {"text": sources[1], "max_new_tokens": 8}]
        bodies.append({"text": sources[1], "max_new_tokens": 8, "num_beams": 1})
        answers = server.post_all(bodies)
        for body, (status, answer) in zip(bodies, answers, strict=True):
            assert status == 200, answer
            flags = [f"--{k}={v}" for k, v in body.items() if k != "text"]
            printed = _cli("translate", "--checkpoint", str(checkpoint), "--text", body["text"], *flags, cwd=tmp_path)
            assert answer["output"] + "\n" == printed.stdout and answer["input"] == body["text"]
        cases = [
            ({"text": "word " * 200}, 400, "the source has"),
            ({"text": "a", "length_penalty_form": "square"}, 422, "length_penalty_form"),
            ({"text": "a", "image": "x"}, 422, "image is not a field of this request"),
        ]
        _check_refusals(server, cases)
        assert server.post_all(bodies[:1]) == answers[:1]  # still serving, still the same answer
        status, answer = server.post({"messages": [{"role": "user", "content": "a"}]}, path="/v1/chat/completions")
        assert status == 404  # no chat route: a translation model is not a chat model, and the answer says so
        assert "serves a language model; this server serves a Translation model: POST /predict" in str(answer)
        server.stop()
        assert server.stopped_in < STOP_SECONDS


# ---- classification: /predict against `predict`'s rows --------------------------------------------------------


@pytest.mark.slow
class TestClassification:
    @pytest.fixture(scope="class")
    def clf(self, tmp_path_factory):
        run = tmp_path_factory.mktemp("serve_clf")
        tiny = ["--model.config.d_model", "32", "--model.config.n_heads", "2", "--model.config.n_layers", "1"]
        tiny += ["--model.config.d_ff", "64", "--data.init_args.vocab_size", "512", "--data.init_args.batch_size", "8"]
        config = ["--config", str(CONFIGS / "presets" / "classify-genre.yaml"), *tiny]
        checkpoint = _fit(run, *config)
        server = Server(checkpoint, "--max_batch_size", "4", "--batch_timeout", "0.2", log=run / "serve.log")
        yield checkpoint, server, config, run
        server.kill()

    def test_concurrent_answers_equal_predict_and_bad_requests(self, clf, tmp_path):
        checkpoint, server, config, run = clf
        lines = ["O Romeo, Romeo, wherefore art thou Romeo?", "Once more unto the breach, dear friends", ""]
        lines.append("the king " * 200)  # past the context: cut, as predict cuts it (it was refused with a 400)
        (tmp_path / "lines.txt").write_text("\n".join(lines) + "\n")
        predict = ["--ckpt_path", str(checkpoint), "--data.init_args.predict_file", "lines.txt"]
        predict += ["--predictions.output", "rows.jsonl", *_where(run)]
        _cli("predict", *config, *predict, cwd=tmp_path)
        rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
        answers = server.post_all([{"text": line} for line in lines])
        for row, (status, answer) in zip(rows, answers, strict=True):
            assert status == 200, answer
            assert answer.keys() == row.keys() and answer["label"] == row["label"] and answer["input"] == row["input"]
            # 1e-4: predict pads each batch to its longest row (here the cut one), the server to its own batch's
            assert answer["probabilities"] == pytest.approx(row["probabilities"], abs=1e-4)
        assert sorted(rows[0]["probabilities"]) == ["comedy", "history", "tragedy"]
        cases = [
            ({"text": ["a"]}, 422, "text: Input should be a valid string"),
            ({"text": "a", "temperature": 0}, 422, "temperature is not a field"),
        ]
        _check_refusals(server, cases)
        assert server.post({"text": lines[0]}) == answers[0]
        server.stop()
        assert server.stopped_in < STOP_SECONDS


# ---- captioning: an image's bytes in, predict's caption of that file out ------------------------------------------


@pytest.mark.slow
class TestCaptioning:
    @pytest.fixture(scope="class")
    def cap(self, tmp_path_factory):
        run = tmp_path_factory.mktemp("serve_cap")
        config = ["--config", str(CONFIGS / "presets" / "caption-digits.yaml"), "--model.config.d_model", "32"]
        config += ["--model.config.d_ff", "64", "--model.config.n_layers", "1", "--data.init_args.strips", "[64, 8, 8]"]
        checkpoint = _fit(run, *config)
        server = Server(checkpoint, "--max_batch_size", "3", "--batch_timeout", "0.2", log=run / "serve.log")
        yield checkpoint, server, config, run
        server.kill()

    def test_images_answer_predicts_captions_and_bad_requests(self, cap, tmp_path):
        from PIL import Image

        from lit_transformer.data.corpora.digits import digit_strips

        checkpoint, server, config, run = cap
        folder = tmp_path / "images"
        folder.mkdir()
        for i, image in enumerate(digit_strips("test", 3).images):
            Image.fromarray((image[0] * 255).astype("uint8")).save(folder / f"strip{i}.png")
        predict = ["--ckpt_path", str(checkpoint), "--data.init_args.predict_file", str(folder)]
        predict += ["--predictions.output", str(tmp_path / "captions.jsonl"), *_where(run)]
        _cli("predict", *config, *predict, "--model.generation.max_new_tokens", "6", cwd=ROOT)
        rows = [json.loads(line) for line in (tmp_path / "captions.jsonl").read_text().splitlines()]
        encoded = {row["image"]: base64.b64encode((folder / row["image"]).read_bytes()).decode() for row in rows}
        # The preset decodes greedily (its model.generation); the same options here.
        options = {"max_new_tokens": 6, "num_beams": 1}
        bodies = [{"image": encoded[row["image"]], "name": row["image"], **options} for row in rows]
        bodies[1]["image"] = "data:image/png;base64," + bodies[1]["image"]  # a data URL, as browsers write them
        answers = server.post_all(bodies)
        assert [answer for _, answer in answers] == rows
        not_png = base64.b64encode(b"GIF89a but not really").decode()
        text = base64.b64encode(io.BytesIO(b"hello").read()).decode()
        cases = [
            ({"image": "%%% not base64 %%%"}, 400, "image is not base64"),
            ({"image": not_png}, 400, "not an image file"),
            ({"image": text, "name": 5}, 422, "name: Input should be a valid string"),
            ({"features": [[0.0, 1.0]]}, 422, "this model captions an image"),
            ({}, 422, "this model captions an image"),
        ]
        _check_refusals(server, cases)
        assert server.post(bodies[0]) == answers[0]
        server.stop()
        assert server.stopped_in < STOP_SECONDS


def test_features_are_captioned_as_the_model_captions_them(tmp_path):
    """A captioning model whose source is features (no data set of them ships): the handler a worker runs, in this
    process, on a checkpoint made without a run; its answers are the model's own captions of those features."""
    import torch
    from PIL import Image

    from lit_transformer.config import GenerationConfig, TransformerConfig
    from lit_transformer.data.text import train_tokenizer
    from lit_transformer.model import Transformer
    from lit_transformer.serving.handlers import ImageCaptioning, ModelOptions, Refusal, load_for_serving
    from lit_transformer.serving.requests import CaptionRequest

    tokenizer = train_tokenizer(["one two three four five six seven eight nine zero " * 20], kind="char", vocab_size=64)
    ids = {name: tokenizer.token_to_id(f"<{name}>") for name in ("pad", "bos", "eos")}
    config = TransformerConfig.preset(
        "tiny", topology="encoder_decoder", source="features", source_dim=6, vocab_size=tokenizer.get_vocab_size(),
        pad_token_id=ids["pad"], bos_token_id=ids["bos"], eos_token_id=ids["eos"], max_seq_len=16,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(config).eval()
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    hparams = {"config": config, "task": "captioning"}
    path = tmp_path / "features.ckpt"
    torch.save({"state_dict": state, "hyper_parameters": hparams, "tokenizer": tokenizer.to_str()}, path)
    options = ModelOptions(str(path))
    handler = ImageCaptioning(load_for_serving(options), options)
    regions = [torch.randn(n, 6, generator=torch.Generator().manual_seed(n)) for n in (3, 5)]
    requests = [CaptionRequest(features=r.tolist(), name=f"r{i}", max_new_tokens=5) for i, r in enumerate(regions)]
    answers = handler.answer([handler.prepare(r) for r in requests])
    gen = GenerationConfig.for_task(handler.loaded.task, max_new_tokens=5)
    for region, answer in zip(regions, answers, strict=True):
        expected = handler.loaded.decode(model.generate(region[None], gen))[0]
        assert answer == {"image": answer["image"], "caption": expected}
    assert [a["image"] for a in answers] == ["r0", "r1"]
    for body, status, says in [
        ({"features": [[0.0] * 5]}, 422, "regions of 6 numbers"),
        ({"features": [[0.0] * 6] * 17}, 400, "more than the model's context of 16"),
        ({"features": [[float("nan")] * 6]}, 422, "not a finite number"),
        ({"image": "aGVsbG8="}, 422, "this model captions image features"),
    ]:
        refusal = handler.prepare(CaptionRequest(**body))
        assert isinstance(refusal, Refusal) and refusal.status == status and says in refusal.reason, refusal
    # an image that claims a huge size is refused from its header, before it is decoded
    png = tmp_path / "huge.png"
    Image.new("1", (10000, 6000)).save(png)
    patches = ImageCaptioning.__new__(ImageCaptioning)
    patches.loaded, patches.options = handler.loaded, options
    refusal = patches.image(base64.b64encode(png.read_bytes()).decode())
    assert isinstance(refusal, Refusal) and refusal.status == 413 and "10000 x 6000" in refusal.reason


# ---- the command line's refusals, before any worker starts ------------------------------------------------------


def test_serve_refuses_in_a_few_lines_before_starting(tmp_path, monkeypatch):
    from lit_transformer.cli.program import main

    def refusal(*args: str) -> str:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
            main(["serve", *args])
        assert len(err.getvalue().strip().splitlines()) <= 3, err.getvalue()
        return err.getvalue()

    assert "does not exist" in refusal("--checkpoint", str(tmp_path / "missing.ckpt"), "--port", str(free_port()))
    assert "1024 to 65535" in refusal("--checkpoint", "x.ckpt", "--port", "80")
    assert "--workers 0" in refusal("--checkpoint", "x.ckpt", "--workers", "0")
    assert "127.0.0.1" in refusal("--checkpoint", "x.ckpt", "--host", "192.168.1.1")
    with socket.socket() as held:
        held.bind((HOST, 0))
        held.listen()
        assert "cannot be bound" in refusal("--checkpoint", "x.ckpt", "--port", str(held.getsockname()[1]))
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "litserve" else real(name, *a))
    assert "pip install -e '.[serve]'" in refusal("--checkpoint", "x.ckpt")
    monkeypatch.undo()
    # int8 batches are not exact: said before anything (batched requests were said to decode as alone, in int8 too)
    said = refusal("--checkpoint", str(tmp_path / "missing.ckpt"), "--quantize", "int8", "--max_batch_size", "4")
    assert "note: --quantize int8 with --max_batch_size above 1" in said and "does not exist" in said
    assert "note:" not in refusal("--checkpoint", str(tmp_path / "missing.ckpt"), "--quantize", "int8")


def _streamed_usage(client, messages: list[dict], n: int):
    """The usage a streamed chat completion ends with (the last chunk)."""
    chunks = list(client.chat.completions.create(model="t", messages=messages, max_tokens=4, n=n, stream=True))
    return chunks[-1].usage


def test_streamed_choices_go_on_until_the_longest_ends():
    """n choices stream side by side; LitServe's azip stopped at the shortest, so a longer choice lost its last
    chunks and its token counts (the usage then counted one choice)."""
    import asyncio

    from lit_transformer.serving.apis import every_event

    async def chunks(n: int):
        for i in range(n):
            yield f"c{i}"

    async def collect():
        return [events async for events in every_event(chunks(1), chunks(3))]

    assert asyncio.run(collect()) == [["c0", "c0"], [None, "c1"], [None, "c2"]]
