# knapsack-lb: the controller, probe worker and admin API (`klb`), and the backend emulator used as
# example backends. docker-compose.yml runs one container per role from this image.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY knapsack_lb ./knapsack_lb
COPY adapters ./adapters
COPY probes ./probes
RUN pip install --no-cache-dir ".[envoy,dns]" \
    && useradd --system --uid 10001 klb
USER klb
ENTRYPOINT ["klb"]
CMD ["--help"]
