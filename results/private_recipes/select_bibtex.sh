#!/bin/bash
# the recipe selection on a validation split of Bibtex's training data (20%, split_seed 0), 3 seeds, ε 1,4,8
export OMP_NUM_THREADS=1  # run from the repository root, with $SECURE_FED_DATA set
run() { name=$1; shift; secure-fed tradeoff experiments/configs/bibtex_private.yaml --set dataset.evaluate_on=validation \
  --methods fedalc --epsilons 1,4,8 --seeds 0,1,2 --prior none --reference none --workers 2 "$@" --out results/private_recipes/bibtex/$name > results/private_recipes/bibtex/$name.log 2>&1
  echo "$name $*"; grep "^| fedalc" results/private_recipes/bibtex/$name/table.md; }
run base
run m1 --set privacy.local.max_labels_per_instance=1
run m3 --set privacy.local.max_labels_per_instance=3
run wide --set model.embedding_dim=512 --set model.embed_dim=1024
run lr100 --set training.client_lr=100
run pld --set privacy.accountant=pld
