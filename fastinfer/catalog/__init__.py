"""What can be served: the backend table, the settings built from it and the environment, the model
store (which versions a server pins) and its integrity checks. Imports engines/ and common/."""
