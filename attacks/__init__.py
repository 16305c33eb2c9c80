"""secfed.attacks — the privacy audit (``secfed audit``): inversion and linkage attacks on everything a
client shares. Not implemented yet; the shared tensors it will attack are defined in
:mod:`secfed.models.sharing` and travel as :class:`secfed.federation.messages.Upload`."""
