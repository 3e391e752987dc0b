"""Several ranks in one engine: data-parallel attention with expert-parallel routed experts.

placement.py        which physical expert slot of which rank holds which logical expert
                    (static, or balanced from measured load with redundant replicas), and the
                    `moe_lb` load-balance metric
group.py            the ranks' process group (gloo on the CPU) and its settings
expert_exchange.py  the all-to-all dispatch of a rank's token slots to the ranks holding their
                    experts, and the combine in a fixed slot order
ranks.py            running one engine per rank in lockstep over a share of the requests
"""
