FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends build-essential cmake git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . /app
# For CUDA offload in llama.cpp build with: --build-arg CMAKE_ARGS="-DGGML_CUDA=on"
ARG CMAKE_ARGS=""
RUN CMAKE_ARGS="$CMAKE_ARGS" pip install --no-cache-dir -e ".[llama]" \
    && python scripts/fetch_demo_model.py /models
ENV MODEL_BOSS_HOST=0.0.0.0 MODEL_BOSS_MODELS_DIR=/models MODEL_BOSS_STATE_DIR=/state
EXPOSE 8210
CMD ["model-boss", "serve"]
