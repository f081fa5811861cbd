"""The Ape-X processes' loops: actor (env -> n-step -> replay), learner (replay -> agent -> priorities,
weights, metrics, checkpoints) and the learner's evaluation child."""
