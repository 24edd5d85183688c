"""Real-applications tests: the library run the way applications run it (a web app under
uvicorn, an asyncio loop that also does CPU work, a delayed network with a stall), on
real servers, through the public API only."""
