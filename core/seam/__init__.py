"""The seam between the engine and speculation: what both sides import, and nothing else.

``engine -> spec -> drafters`` import downwards only; every record or
interface two of them share lives here, below all three (the import-linter
contracts in pyproject.toml hold the order):

* :mod:`~hyspec.seam.views` -- read-only views of what the engine owns
  (a sequence, its sampling parameters, the scheduler and its step output);
* :mod:`~hyspec.seam.tree` -- :class:`DraftTree` (and the verifier's padded ``TreeBatch``);
* :mod:`~hyspec.seam.proposer` -- the :class:`Proposer` interface and what it is passed;
* :mod:`~hyspec.seam.target` -- :class:`TargetContext`, what a drafter may know of the target;
* :mod:`~hyspec.seam.forward` -- one packed forward over paged KV (``Feed``, ``ModelRunner``),
  run by the engine for the target and by drafters for their own modules;
* :mod:`~hyspec.seam.step` -- the records one engine step passes between its stages
  (``StepPlan``, ``Drafts``, ``TargetRun``, ``Accepted``).

The seam itself imports only the layers below it (kv, ops, model, backend, errors).
"""
