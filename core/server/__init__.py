"""hyspec.server: the OpenAI-compatible HTTP server (needs the ``serve`` extra: fastapi, uvicorn, prometheus_client).

    app.py           create_app(): routes, lifespan, API key, HTTP metrics, OpenAPI schema
    serving.py       /v1/completions and /v1/chat/completions: prompts -> engine requests -> JSON or SSE
    async_engine.py  AsyncEngine: the single-threaded engine on a thread of its own, streams on asyncio
    protocol.py      request/response bodies (pydantic), field validation
    errors.py        OpenAI-style error bodies and exception handlers
    metrics.py       Prometheus metrics on a per-app registry (+ the speculative decoder's collector)
    auth.py          optional Bearer API key
    launcher.py      uvicorn in the foreground (hyspec serve) or in a thread (tests, load tests)

Nothing here is imported by ``import hyspec``.
"""
