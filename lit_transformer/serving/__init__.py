"""`serve`: a checkpoint behind HTTP on LitServe, Lightning's serving library (`pip install -e ".[serve]"`).

Every task answers `POST /predict` with the fields of `predict`'s JSON lines: a request is one input (and its decoding
options), the answer is the row `predict` writes for it, computed by the same code (Task.predict and
tasks.base.generation_rows). A language model also answers `POST /v1/chat/completions` as OpenAI's API does (LitServe's
OpenAISpec, streaming or not), so the `openai` client library talks to it unchanged. `GET /health` says whether every
worker is ready, `GET /info` what is served.

- requests.py: the request bodies, as pydantic models FastAPI checks before a worker sees them (strict types, no
  unknown field), and the one-line reason a malformed body gets.
- handlers.py: what a worker does with a checkpoint, one class per kind of task: a request made into a model input or
  refused (a prompt past the context, an image that is not one), and a batch of inputs run.
- apis.py: the LitServe APIs (`/predict` for every task, the chat route for language models).
- server.py: the checks made before any worker starts, the LitServer, and a SIGTERM that ends it within seconds.

No module here is imported by the package's other commands: LitServe is an optional dependency.
"""
