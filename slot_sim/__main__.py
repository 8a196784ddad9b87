from slot_sim.run import main

raise SystemExit(main())
