"""The HTTP face: the app, routes, request and response schemas, the OpenAPI document, SSE, errors,
auth, metrics, logging.
"""
