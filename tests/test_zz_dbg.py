from tests.test_admin import *
def test_dbg(history, superuser_client):
    url = reverse("admin:fencedjobs_jobrun_changelist")
    html = superuser_client.get(url).content.decode()
    i = html.find('id="result_list"')
    print(html[i-2000:i+3000] if i>0 else html[html.find('<div id="content"'):][:3000])
