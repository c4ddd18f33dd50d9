"""The engine core: what a step plans and the state it plans over.

``sequence`` (one token stream), ``request_state`` (a request's output side), ``scheduler``
(the plan), ``plan`` (the contract between scheduler and runner), ``block_manager`` (KV block
accounting and the prefix cache), ``kv_cache`` (the K/V tensors), ``outputs`` (what is streamed).
"""
