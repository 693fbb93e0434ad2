"""OpenAI's Batch API on the bulk class: files, batches, and the supervisor that runs them.

Kept import-free on purpose: `gateway.http.state` imports `gateway.batch.runtime`, and the route
modules import the parts they need directly.
"""
