"""The Gaussians: their rows and every operation on them, initialisation, the densification
strategies with their keyed draws, the densifier the pipeline calls, and the id blocks a sharded
rank owns, and the memory budget that caps their growth. Not here: ``model/`` renders them;
``parallel/`` moves and gathers them."""
