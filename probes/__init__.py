"""The probe worker (the paper's KLM, section 5): measures each DIP's application latency
directly, bypassing the load balancer, and writes it into the latency store."""
