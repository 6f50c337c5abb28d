FROM python:3.11-slim
# llama.cpp in the xllamacpp wheel links OpenMP (libgomp.so.1), which the slim image lacks
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . /app
# Nothing is compiled: llama.cpp's server comes prebuilt in the xllamacpp wheel (a CPU build).
# On a CUDA box, install a CUDA build of llama-server into the image (or mount one) and set
# MODEL_BOSS_LLAMA_SERVER_BINARY=/path/to/llama-server: llama manifests then run it
# (worker: binary); see docs/CONFIGURATION.md. The tracing extra: OpenTelemetry's exporters,
# used only when OTEL_* (or the config's tracing: section) turn traces on.
RUN pip install --no-cache-dir -e ".[llama,tracing]" \
    && python scripts/fetch_demo_model.py /models
ENV MODEL_BOSS_HOST=0.0.0.0 MODEL_BOSS_MODELS_DIR=/models MODEL_BOSS_STATE_DIR=/state
EXPOSE 8210
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('MODEL_BOSS_PORT', '8210'), timeout=4)"
CMD ["model-boss", "serve"]
