"""lockstep's patched SGLang runtime: decision consensus, collective probe, rank state,
pod agent and bounded gloo timeouts, layered on a pinned SGLang release.

Modules that must import without torch or SGLang (``rank_state``, ``agent``,
``gloo_timeout``, ``probe``, ``consensus``, ``collectives``, ``standalone``, ``config``,
``pins``, ``launcher``) import them lazily; ``hooks`` (scheduler processes) and
``server_hooks`` (the main process) import SGLang. Nothing here imports the operator
package ``lockstep``.
"""

__version__ = "0.1.0"
