"""``GET /metrics``: the serving engine's counters in the Prometheus text format (prometheus_client)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from omnijax.app.engine_stats import TTFT_BUCKETS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class EngineCollector:
    """Collects ``scheduler``'s figures at every scrape (nothing is copied in between)."""

    def __init__(self, scheduler, model: str):
        self.scheduler = scheduler
        self.model = model

    def collect(self):
        s, st = self.scheduler, self.scheduler.stats
        labels = ["model"]

        def counter(name, doc, value):
            m = CounterMetricFamily(f"omnijax_{name}", doc, labels=labels)
            m.add_metric([self.model], value)
            return m

        def gauge(name, doc, value):
            m = GaugeMetricFamily(f"omnijax_{name}", doc, labels=labels)
            m.add_metric([self.model], value)
            return m

        finished = CounterMetricFamily("omnijax_requests_finished", "Requests finished, by how they ended",
                                       labels=labels + ["finish_reason"])
        for reason in ("eos", "stop", "length", "cancelled"):
            finished.add_metric([self.model, reason], st.finished.get(reason, 0))
        yield finished
        yield counter("requests_failed", "Requests that ended with an error", st.failed)
        yield gauge("requests_running", "Requests holding a slot (prefilling or decoding)", s.running)
        yield gauge("requests_waiting", "Requests queued for a slot", s.queue_depth)
        yield gauge("slots", "Slots of the engine (requests decoded together)", s.slots.slots)
        yield gauge("requests_running_peak", "The most requests that held a slot at once", st.peak_running)
        yield gauge("kv_cache_pages", "Pages of the KV cache's pools (requests hold the pages of their prompt and "
                    "answer)", s.slots.pages.pages)
        yield gauge("kv_cache_pages_free", "Pages of the KV cache's pools that no request holds", s.slots.pages.free)
        yield counter("prompt_tokens", "Prompt tokens of finished requests", st.prompt_tokens)
        yield counter("prompt_tokens_cached", "Prompt tokens taken from the prefix cache", st.cached_tokens)
        yield counter("generation_tokens", "Generated tokens of finished requests", st.generated_tokens)
        yield counter("decode_steps", "Decode steps run", st.steps)
        yield counter("prefix_cache_queries", "Prefix cache lookups", s.prefix.lookups)
        yield counter("prefix_cache_hits", "Prefix cache lookups that found a prefix", s.prefix.hits)
        yield gauge("prefix_cache_hit_rate", "Prefix cache hits per lookup", s.prefix.hit_rate)
        yield gauge("prefix_cache_bytes", "Bytes held by the prefix cache", s.prefix.store.bytes)
        yield counter("media_cache_queries", "Media items looked up in the media cache",
                      s.media.store.hits + s.media.store.misses)
        yield counter("media_cache_hits", "Media items found encoded already", s.media.store.hits)
        yield gauge("media_cache_hit_rate", "Media cache hits per item", s.media.store.hit_rate)
        yield gauge("media_cache_bytes", "Bytes held by the media cache", s.media.store.bytes)
        ttft = HistogramMetricFamily("omnijax_time_to_first_token_seconds",
                                     "Seconds from a request's arrival to its first token", labels=labels)
        buckets = [(str(b), c) for b, c in zip(TTFT_BUCKETS, st.ttft_counts)] + [("+Inf", st.ttft_count)]
        ttft.add_metric([self.model], buckets, st.ttft_sum)
        yield ttft


def metrics_text(scheduler, model: str) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(scheduler, model))
    return generate_latest(registry)
