import json,sys,statistics as st
for n in sys.argv[1:]:
    recs=[json.loads(l) for l in open(f"/tmp/thr/{n}/metrics.jsonl")]
    t=[r['seconds_sampling']+r['seconds_behaviour']+r['seconds_learner'] for r in recs[2:]]
    print(n, len(recs), "median s/update", round(st.median(t),2), [round(x,1) for x in t])
