# Inference worker on a GPU: vLLM's image brings its own torch; we add only the control-plane deps.
FROM vllm/vllm-openai:latest
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir -e ".[inference-gpu]"
ENV VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
ENTRYPOINT ["dgrpo", "worker", "inference", "--engine", "vllm"]
