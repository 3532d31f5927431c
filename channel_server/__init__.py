"""Channel service (aiohttp): catalog, channel lifecycle, buffering. Built in issue 3."""
