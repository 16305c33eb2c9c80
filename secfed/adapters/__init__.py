"""secfed inside other federated-learning stacks.

``secfed.adapters.flower`` (``pip install 'secfed[flower]'``): secure aggregation as a Flower
ClientApp mod and ServerApp workflow, a strategy wrapper for weighted-mean strategies, and
``secfed train --flower`` with each site's clients on Flower SuperNodes.
"""
