"""The HTTP front: connection limits, the middleware (admission, keys, bodies, deadlines), the image
routes' declarations and HTTP forms, the OpenAPI spec and API page, the dashboard's files, /backends'
inventory and /analyze's Groq call. Imports serving/ and everything below it."""
