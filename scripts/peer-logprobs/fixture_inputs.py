"""Writes peer-logprobs inputs (in_<model>_<name>.txt) for every run of the given greedy fixtures,
with the generated ids up to and including the first near-tie (top1 - top2 <= 0.05)."""
import json,sys,math
for fn in sys.argv[1:]:
    for l in open(fn):
        r=json.loads(l)
        n=0
        for k,s in enumerate(r['steps']):
            n=k+1
            p=[math.exp(t[1]) for t in s['top']]
            if p[0]-p[1]<=0.05: break
        out=open(f"in_{r['model'][:4]}_{r['name']}.txt","w")
        out.write("P "+" ".join(map(str,r['prompt_ids']))+"\n")
        out.write("G "+" ".join(map(str,r['generated_ids'][:n]))+"\n")
        out.write("E\n")
        print(r['model'][:4], r['name'], n)
