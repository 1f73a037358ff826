# Trainer worker on a GPU: unsloth pins torch/transformers/trl, so it lives only in this image.
FROM pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir -e ".[trainer-gpu]"
ENTRYPOINT ["dgrpo", "worker", "trainer"]
