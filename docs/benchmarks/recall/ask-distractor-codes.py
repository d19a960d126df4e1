# `memctl ask` on 3,000- and 9,000-word documents holding one asked access code and three
# others ("The access code for the cellar is 4522457."), 8 documents each, in essays as
# filler. Prints each answer and the number right per length.
#
#   python3 docs/benchmarks/recall/ask-distractor-codes.py target/debug/memctl [HAYSTACK_DIR]
import glob, json, random, subprocess, sys
haystack = sys.argv[2] if len(sys.argv) > 2 else "../shared/data/haystack/paul-graham-essays"
essays = " ".join(open(f).read() for f in sorted(glob.glob(haystack + "/*")))
words = essays.split()
places = ["north gate", "boathouse", "east wing", "cellar", "old mill", "greenhouse", "radio room", "west pier"]
M = sys.argv[1]
right = {3000: 0, 9000: 0}
for n in (3000, 9000):
    for seed in range(1, 9):
        rng = random.Random(seed)
        start = rng.randrange(0, len(words) - n)
        doc = words[start:start + n]
        chosen = rng.sample(places, 4)
        codes = [str(rng.randrange(1000000, 9999999)) for _ in chosen]
        spots = sorted(rng.sample(range(n), 4), reverse=True)
        order = list(range(4)); rng.shuffle(order)
        for spot, i in zip(spots, order):
            doc.insert(spot, f"The access code for the {chosen[i]} is {codes[i]}.")
        asked = rng.randrange(4)
        q = f"What is the access code for the {chosen[asked]}?"
        out = subprocess.run([M, "ask", q, "--json"], input=" ".join(doc), capture_output=True, text=True)
        ans = json.loads(out.stdout)["extracted"] if out.returncode == 0 else out.stderr[-200:]
        ok = codes[asked] in ans and not any(c in ans for j, c in enumerate(codes) if j != asked)
        right[n] += ok
        print(n, seed, ok, q, codes[asked], "->", ans[:120], flush=True)
print(json.dumps(right))
