#!/bin/bash
# Issue 55's check on Mulan sets the Bibtex recipe was never selected on: the shipped recipe with only the data set
# swapped, at ε = 8 (10 seeds; issue 55 reads seeds 0-2), against non-private FedALC (experiments/configs/bibtex_fedalc.yaml, the data set
# swapped, 3 seeds). Run from the repository root with $SECURE_FED_DATA set; writes results/private_recipes/.
set -e
out=results/private_recipes/unseen; mkdir -p $out
for ds in emotions yeast scene; do
  secure-fed tradeoff experiments/configs/bibtex_private.yaml --set dataset.name=$ds --methods fedalc --epsilons 8 \
    --seeds 0,1,2,3,4,5,6,7,8,9 --prior none --reference none --workers 2 --out $out/$ds-private > $out/$ds-private.log 2>&1
  secure-fed tradeoff experiments/configs/bibtex_fedalc.yaml --set dataset.name=$ds --methods fedalc --epsilons inf \
    --seeds 0,1,2 --prior none --reference none --workers 2 --out $out/$ds-nonprivate > $out/$ds-nonprivate.log 2>&1
  echo "$ds private ε=8: $(grep '^| fedalc' $out/$ds-private/table.md)"
  echo "$ds non-private FedALC: $(grep '^| fedalc' $out/$ds-nonprivate/table.md)"
done
