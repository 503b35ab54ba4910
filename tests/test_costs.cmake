# Seconds each long test takes on a 2-core machine (release, ASan+UBSan), measured by ctest on
# a clean clone. ctest -j starts tests in descending COST; without costs a fresh build tree runs
# them in declaration order, and the longest (declared last) then finish alone while the other
# core idles. A name that no longer exists is ignored; re-measure from a build tree's
# Testing/Temporary/CTestCostData.txt when the suite changes shape.
set(GALE_TEST_COSTS
  EngineTest.ConcurrentEqualsAloneOnEachArchitecture=25:170
  gale_structured=20:145
  gale_server=28:123
  RetentionTest.ConcurrentSequencesGrowAsTheBudgetShrinks=8:84
  gale_cli=12:71
  gale_mpi=27:67
  gale_cluster=48:59
  KvQuantTest.CalibratedKeyChannelsCutTheError=14:45
  Deepseek41Test.GivesTheFloat64ReferenceLogits=10:43
  QuantizeTest.EachArchitectureQuantizes=4:41
  EngineTest.SpeculativeDecodingKeepsOutputsExact=4:39
  QuantizeTest.CalibratedSchemesRoundTrip=6:32
  HfTokenizerTest.RealTokenizersMatchHuggingFaceOnEdgeCases=6:27
  EngineTest.QuantizedKvKeepsOutputsExact=3:21
  Deepseek41Test.PrefillEqualsDecoding=3:17
  SamplerTest.NucleusOverALargeVocabularyMatchesTheSortedDefinition=4:16
  Deepseek4Test.GivesLlamaCppLogits=3:16
  EngineTest.WindowedLayerGroupsHoldAFractionOfTheKv=2:15
  gale_loadgen=12:13
  SpecVerifyTest.KeepsTheTargetDistributionOnTheDefaultModel=1:13
  HfConvertTest.QwenRoundTrips=2:12
  Deepseek4Test.PrefillEqualsDecoding=2:10
  TokenizerTest.AllSharedVocabsAccountedFor=2:9
  HfTokenizerTest.RealTokenizersPassLlamaCppVectors=2:9
  TokenizerTest.LlamaCppVectors=2:8)
