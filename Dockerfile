FROM python:3.11-slim
WORKDIR /app
COPY . /app
# Nothing is compiled: llama.cpp's server comes prebuilt in the xllamacpp wheel (a CPU build).
# On a CUDA box, install a CUDA build of llama-server into the image (or mount one) and set
# MODEL_BOSS_LLAMA_SERVER_BINARY=/path/to/llama-server: llama manifests then run it
# (worker: binary); see docs/CONFIGURATION.md.
RUN pip install --no-cache-dir -e ".[llama]" \
    && python scripts/fetch_demo_model.py /models
ENV MODEL_BOSS_HOST=0.0.0.0 MODEL_BOSS_MODELS_DIR=/models MODEL_BOSS_STATE_DIR=/state
EXPOSE 8210
CMD ["model-boss", "serve"]
