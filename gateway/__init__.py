"""fairlane's server side, one folder per process: ``api/`` (a gateway replica: OpenAI and admin
HTTP, auth, quotas, the SLO door check), ``worker/`` (an engine worker), ``lanes/`` (the Redis
protocol between them) and ``cli/`` (the ``fairlane`` command); ``settings.py`` is the settings of
all three. Modules import what they use from where it is defined.
"""
