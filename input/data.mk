# The default data recipe: the King James Bible (Debian's bible-kjv), verse references
# stripped, one verse per line; every 20th block of 100 verses held out for validation;
# tokenized with a SentencePiece BPE of 4096 pieces trained on the training text.
DATA_DIR   ?= input/data
DATA_VOCAB ?= 4096

.PHONY: data
data: $(DATA_DIR)/kjv-train.h5

$(DATA_DIR)/kjv.txt:
	@mkdir -p $(DATA_DIR)
	@command -v bible >/dev/null || { echo "trident: error: 'bible' not found: install the Debian package bible-kjv (make deps)" >&2; exit 1; }
	bible -f "Gen1:1-Rev22:21" | sed -E 's/^[^ ]+ //' > $@.tmp && mv $@.tmp $@

$(DATA_DIR)/kjv-train.h5: $(DATA_DIR)/kjv.txt $(TRIDENT)
	$(TRIDENT) prepare-data --input $< --output $@ --valid-output $(DATA_DIR)/kjv-valid.h5 \
	  --valid-every 20 --tokenizer sentencepiece --vocab-size $(DATA_VOCAB)
